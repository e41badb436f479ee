"""Keyed bijections on ``[0, n)``: an unbalanced Feistel network with cycle walking.

The exact algorithm is specified in docs/ORDER.md ("Keyed permutation"); every
function here has a numpy form (vectorized, per-element keys) and a plain
``int`` form (for a handful of values, where numpy's per-call overhead
dominates). Both compute the same 64-bit arithmetic and are tested against the
golden vectors in tests/test_plan_permutation.py.

Nothing here uses ``numpy.random``: its streams may change across releases, and
a months-long run must read the same order after an upgrade.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
MIX_M1 = 0xBF58476D1CE4E5B9
MIX_M2 = 0x94D049BB133111EB
GOLDEN = 0x9E3779B97F4A7C15
MIN_ROUNDS = 6
MAX_ROUNDS = 18
# Round constants are fixed by the spec; a round key is instance key ^ constant.
ROUND_CONSTANTS = tuple(((r + 1) * GOLDEN) & MASK64 for r in range(MAX_ROUNDS))

# Domain tags of the keys derived in the global order (docs/ORDER.md).
TAG_BLOCKS = 0x5A45_0001
TAG_WINDOW = 0x5A45_0002
TAG_REST_BLOCK = 0x5A45_0003

_U64_M1 = np.uint64(MIX_M1)
_U64_M2 = np.uint64(MIX_M2)
_U64_GOLDEN = np.uint64(GOLDEN)
_U64_ROUND_CONSTANTS = tuple(np.uint64(k) for k in ROUND_CONSTANTS)
_S27, _S30, _S31, _S32 = (np.uint64(s) for s in (27, 30, 31, 32))


def mix64_int(z: int) -> int:
    """The splitmix64 finalizer on one unsigned 64-bit integer."""
    z = (z ^ (z >> 30)) * MIX_M1 & MASK64
    z = (z ^ (z >> 27)) * MIX_M2 & MASK64
    return z ^ (z >> 31)


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on a ``uint64`` array (wrapping arithmetic)."""
    z = (z ^ (z >> _S30)) * _U64_M1
    z = (z ^ (z >> _S27)) * _U64_M2
    return z ^ (z >> _S31)


def derive_key_int(tag: int, *values: int) -> int:
    """The 64-bit key of one permutation instance, from a tag and integers.

    Args:
        tag: domain tag (``TAG_BLOCKS``, ``TAG_WINDOW``).
        *values: integers in ``[0, 2**64)`` (seed, stream, epoch, ...).
    """
    key = tag & MASK64
    for value in values:
        assert 0 <= value <= MASK64, value
        key = mix64_int(((key ^ value) + GOLDEN) & MASK64)
    return key


def derive_key(tag: int, *values: int | np.ndarray) -> np.ndarray:
    """``derive_key_int`` over arrays: each value is an int or an integer array."""
    key = np.full(np.broadcast_shapes(*(np.shape(v) for v in values)), tag & MASK64, np.uint64)
    for value in values:
        key = mix64((key ^ np.asarray(value).astype(np.uint64)) + _U64_GOLDEN)
    return key


def domain_bits(n: int) -> tuple[int, int]:
    """Bit widths ``(high, low)`` of the Feistel state for a domain of size ``n``."""
    bits = max(2, (n - 1).bit_length())
    low = bits // 2
    return bits - low, low


def feistel_rounds(bits: int) -> int:
    """Number of rounds for a Feistel state of ``bits`` bits.

    Narrow halves give weak round functions and cycle walking exposes the
    structure, so small domains get more rounds (measured: 6 rounds on n = 5 is
    visibly non-uniform; 16 is not).
    """
    return MIN_ROUNDS + 2 * max(0, 8 - bits)


def _encrypt_int(x: int, round_keys: tuple[int, ...], high: int, low: int) -> int:
    left, right = x >> low, x & ((1 << low) - 1)
    shift_even, shift_odd = 64 - high, 64 - low
    for r in range(0, len(round_keys), 2):
        t = (right ^ round_keys[r]) * MIX_M1 & MASK64
        t = (t ^ (t >> 32)) * MIX_M2 & MASK64
        left, right = right, left ^ (t >> shift_even)
        t = (right ^ round_keys[r + 1]) * MIX_M1 & MASK64
        t = (t ^ (t >> 32)) * MIX_M2 & MASK64
        left, right = right, left ^ (t >> shift_odd)
    return (left << low) | right


class KeyedPermutation:
    """One keyed bijection of ``[0, n)`` with its round keys prepared, for int inputs.

    Args:
        n: domain size, >= 1.
        key: 64-bit instance key.
    """

    __slots__ = ("n", "key", "_high", "_low", "_round_keys")

    def __init__(self, n: int, key: int) -> None:
        assert n >= 1, n
        self.n, self.key = n, key
        self._high, self._low = domain_bits(n)
        rounds = feistel_rounds(self._high + self._low)
        self._round_keys = tuple(key ^ c for c in ROUND_CONSTANTS[:rounds])

    def __call__(self, x: int) -> int:
        """Image of ``x`` (in ``[0, n)``)."""
        assert 0 <= x < self.n, (x, self.n)
        if self.n == 1:
            return 0
        x = _encrypt_int(x, self._round_keys, self._high, self._low)
        while x >= self.n:
            x = _encrypt_int(x, self._round_keys, self._high, self._low)
        return x


def permute_int(x: int, n: int, key: int) -> int:
    """Image of ``x`` under the keyed bijection of ``[0, n)``."""
    return KeyedPermutation(n, key)(x)


def _encrypt(x: np.ndarray, key: np.ndarray, high: np.uint64, low: np.uint64, rounds: int) -> np.ndarray:
    left, right = x >> low, x & ((np.uint64(1) << low) - np.uint64(1))
    shifts = (np.uint64(64 - int(high)), np.uint64(64 - int(low)))
    for r, constant in enumerate(_U64_ROUND_CONSTANTS[:rounds]):
        t = (right ^ (key ^ constant)) * _U64_M1
        t = (t ^ (t >> _S32)) * _U64_M2
        # Even rounds produce the high-width half, odd rounds the low-width one.
        left, right = right, left ^ (t >> shifts[r & 1])
    # The round count is even, so the halves are back to (high, low) widths.
    return (left << low) | right


def permute(x: np.ndarray, n: np.ndarray | int, key: np.ndarray | int) -> np.ndarray:
    """Vectorized ``permute_int``: element ``i`` maps ``x[i]`` in ``[0, n[i])`` with ``key[i]``.

    Args:
        x: integer array of values, each in ``[0, n)``.
        n: domain sizes (an int or an array broadcastable to ``x``), each >= 1.
        key: 64-bit instance keys (an int or a ``uint64`` array broadcastable to ``x``).

    Returns:
        An ``int64`` array shaped like ``x``.
    """
    x = np.asarray(x)
    shape = x.shape
    x = x.astype(np.uint64).ravel()
    key_arr = np.broadcast_to(np.asarray(key, dtype=np.uint64), shape).ravel()
    if np.ndim(n) == 0:
        return _permute_one_domain(x, int(n), key_arr).reshape(shape)
    n_arr = np.broadcast_to(np.asarray(n, dtype=np.int64), shape).ravel()
    domains, which = np.unique(n_arr, return_inverse=True)
    if domains.size == 1:
        return _permute_one_domain(x, int(domains[0]), key_arr).reshape(shape)
    # The Feistel state depends on a domain only through its bit
    # widths, so domains of one width are encrypted together and each value
    # walks its own cycle; the result is that of each domain on its own.
    widths = np.array([max(2, (d - 1).bit_length()) for d in domains.tolist()], dtype=np.int64)[which.ravel()]
    out = np.empty(x.shape, dtype=np.int64)
    for bits in np.unique(widths).tolist():
        group = np.flatnonzero(widths == bits)
        out[group] = _permute_one_width(x[group], n_arr[group], key_arr[group], bits)
    return out.reshape(shape)


def _permute_one_width(x: np.ndarray, n: np.ndarray, key: np.ndarray, bits: int) -> np.ndarray:
    """``permute`` of values whose domains ``n`` all have Feistel states of ``bits`` bits."""
    assert x.size == 0 or bool((x < n.astype(np.uint64)).all()), "permute: value outside domain"
    low = bits // 2
    high_u, low_u, bound = np.uint64(bits - low), np.uint64(low), n.astype(np.uint64)
    rounds = feistel_rounds(bits)
    out = _encrypt(x, key, high_u, low_u, rounds)
    pending = np.flatnonzero(out >= bound)
    while pending.size:
        out[pending] = _encrypt(out[pending], key[pending], high_u, low_u, rounds)
        pending = pending[out[pending] >= bound[pending]]
    return out.astype(np.int64)


def _permute_one_domain(x: np.ndarray, n: int, key: np.ndarray) -> np.ndarray:
    assert n >= 1 and (x.size == 0 or int(x.max()) < n), ("permute: value outside domain", n)
    if n == 1:
        return np.zeros(x.shape, dtype=np.int64)
    high, low = domain_bits(n)
    rounds = feistel_rounds(high + low)
    high_u, low_u, bound = np.uint64(high), np.uint64(low), np.uint64(n)
    out = _encrypt(x, key, high_u, low_u, rounds)
    pending = np.flatnonzero(out >= bound)
    while pending.size:
        out[pending] = _encrypt(out[pending], key[pending], high_u, low_u, rounds)
        pending = pending[out[pending] >= bound]
    return out.astype(np.int64)
