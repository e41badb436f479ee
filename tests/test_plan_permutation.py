"""The keyed permutation: golden vectors, bijection, and numpy == int forms.

The golden vectors were produced by the algorithm in docs/ORDER.md; a numpy or
Python upgrade that changes any of them would silently change every running
job's data order, so these tests must fail then.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_stream.plan import GlobalOrder, OrderConfig, StreamShape
from zephon_stream.plan.permutation import (
    TAG_BLOCKS,
    TAG_WINDOW,
    derive_key,
    derive_key_int,
    mix64,
    mix64_int,
    permute,
    permute_int,
)

M64 = (1 << 64) - 1


def spec_permute(x: int, n: int, key: int) -> int:
    """docs/ORDER.md "Keyed permutation", transcribed line by line."""
    m1, m2, golden = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15
    if n == 1:
        return 0
    bits = max(2, (n - 1).bit_length())
    low = bits // 2
    high = bits - low
    rounds = 6 + 2 * max(0, 8 - bits)

    def encrypt(v: int) -> int:
        left, right = v >> low, v & ((1 << low) - 1)
        for r in range(rounds):
            t = ((right ^ key ^ ((r + 1) * golden & M64)) * m1) & M64
            t = ((t ^ (t >> 32)) * m2) & M64
            width = high if r % 2 == 0 else low
            left, right = right, left ^ (t >> (64 - width))
        return (left << low) | right

    y = encrypt(x)
    while y >= n:
        y = encrypt(y)
    return y


def test_mix64_and_key_derivation_golden_vectors():
    assert mix64_int(0) == 0
    assert mix64_int(1) == 0x5692161D100B05E5
    assert mix64_int(0x0123456789ABCDEF) == 0xB2C058E4EBB5112C
    assert derive_key_int(TAG_BLOCKS, 0, 0, 0) == 0x7C8646E166A139FD
    assert derive_key_int(TAG_WINDOW, 42, 1, 2, 3, 4) == 0x76CF118050756999
    assert derive_key_int(TAG_BLOCKS, M64, 7, 123456) == 0x6489070F2725060F


@pytest.mark.parametrize(
    ("n", "key", "expected"),
    [
        (2, derive_key_int(TAG_BLOCKS, 0, 0, 0), [1, 0]),
        (5, derive_key_int(TAG_BLOCKS, 1, 0, 0), [0, 2, 1, 4, 3]),
        (10, 0, [9, 1, 6, 2, 5, 8, 0, 7, 4, 3]),
        (16, derive_key_int(TAG_WINDOW, 42, 1, 2, 3, 4), [2, 8, 9, 6, 5, 1, 4, 10, 13, 12, 7, 0]),
        (1000, derive_key_int(TAG_BLOCKS, 7, 0, 1), [727, 721, 454, 956, 809, 217, 207, 836, 849, 378, 382, 795]),
    ],
)
def test_permutation_golden_vectors(n, key, expected):
    xs = list(range(len(expected)))
    assert [permute_int(x, n, key) for x in xs] == expected
    assert permute(np.array(xs), n, key).tolist() == expected
    assert [spec_permute(x, n, key) for x in xs] == expected


def test_permutation_golden_vectors_large_domains():
    key = derive_key_int(TAG_BLOCKS, 2024, 0, 3)
    xs = [0, 1, 2, 999_999, 123_456]
    assert [permute_int(x, 10**6, key) for x in xs] == [746187, 604317, 643034, 173376, 525879]
    big = 2**40 + 3
    expected = [156928941951, 530333888551, 367654758460]
    assert permute(np.array([0, 1, big - 1]), big, key).tolist() == expected


def test_whole_order_golden_vector():
    """Pins blocks, lanes, windows, short blocks and the mixture together."""
    a = StreamShape.from_counts("a", 1025, [1025] * 10 + [300] + [1025] * 5 + [7])
    b = StreamShape.from_counts("b", 513, [513] * 6 + [100])
    order = GlobalOrder([a, b], OrderConfig(seq_len=32, lanes=6, seed=11, weights=(2, 1)))
    stream, block, sample = order.sample_at(np.arange(0, 2400, 97))
    expected = [
        (0, 11, 30), (1, 0, 6), (0, 12, 22), (0, 6, 2), (1, 5, 9), (0, 14, 18), (0, 0, 13),
        (1, 2, 9), (0, 14, 16), (0, 15, 21), (1, 5, 10), (0, 6, 2), (0, 11, 12), (1, 1, 13),
        (0, 5, 15), (0, 8, 4), (1, 0, 3), (0, 13, 29), (0, 6, 24), (1, 0, 9), (0, 14, 18),
        (0, 11, 28), (1, 2, 14), (0, 9, 19), (0, 12, 4),
    ]  # fmt: skip
    assert list(zip(stream.tolist(), block.tolist(), sample.tolist())) == expected


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 255, 256, 257, 1000, 4097])
def test_permutation_is_a_bijection_exhaustively(n):
    for seed in range(3):
        key = derive_key_int(TAG_BLOCKS, seed, n, 0)
        image = permute(np.arange(n), n, key)
        assert sorted(image.tolist()) == list(range(n))
        assert image.tolist() == [permute_int(x, n, key) for x in range(n)]


def test_permutation_is_a_bijection_on_a_large_domain_sampled():
    n = 3 * 2**30 + 17
    key = derive_key_int(TAG_BLOCKS, 5, 0, 0)
    xs = np.unique(np.linspace(0, n - 1, 200_000).astype(np.int64))
    image = permute(xs, n, key)
    assert image.min() >= 0 and image.max() < n
    assert np.unique(image).size == xs.size


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 2**62),
    data=st.data(),
    key=st.integers(0, M64),
)
def test_numpy_int_and_spec_forms_agree(n, data, key):
    xs = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8))
    expected = [spec_permute(x, n, key) for x in xs]
    assert [permute_int(x, n, key) for x in xs] == expected
    assert permute(np.array(xs, dtype=np.int64), n, key).tolist() == expected


def test_vectorized_keys_and_domains_per_element():
    n = np.array([1, 2, 3, 5, 300, 5000, 9] * 30)
    x = (np.arange(n.size) * 7919) % n
    keys = derive_key(TAG_WINDOW, 3, np.arange(n.size), 1)
    assert keys.tolist() == [derive_key_int(TAG_WINDOW, 3, i, 1) for i in range(n.size)]
    out = permute(x, n, keys)
    assert out.tolist() == [permute_int(int(a), int(b), int(k)) for a, b, k in zip(x, n, keys)]
    assert mix64(np.array([1], dtype=np.uint64)).tolist() == [mix64_int(1)]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), bits=st.integers(2, 40))
def test_domains_of_one_width_encrypted_together_equal_each_on_its_own(data, bits):
    # Permute encrypts domains of one Feistel width in one pass; each
    # value must still walk the cycle of its own domain.
    sizes = data.draw(
        st.lists(st.integers(max(1, 2 ** (bits - 1) + 1) if bits > 2 else 1, 2**bits), min_size=2, max_size=12)
    )
    n = np.array(sizes, dtype=np.int64)
    x = np.array([data.draw(st.integers(0, size - 1)) for size in sizes], dtype=np.int64)
    keys = derive_key(TAG_WINDOW, bits, np.arange(n.size), 2)
    assert permute(x, n, keys).tolist() == [permute_int(int(a), int(b), int(k)) for a, b, k in zip(x, n, keys)]


@pytest.mark.parametrize("n", [3, 5, 6, 10, 100])
def test_permutation_spreads_each_value_uniformly_over_keys(n):
    """Each x lands on each y about equally often across keys (chi-square)."""
    trials = 6000
    keys = derive_key(TAG_BLOCKS, np.arange(trials))
    xs = np.tile(np.arange(n), trials)
    ys = permute(xs, n, np.repeat(keys, n))
    counts = np.zeros((n, n))
    np.add.at(counts, (xs, ys), 1)
    expected = trials / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = (n - 1) ** 2
    # Mean dof, sd sqrt(2 dof); 6 sd is far beyond chance but far below
    # what 6-round Feistel shows on n = 5 (about 230 sd).
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, (n, chi2, dof)
