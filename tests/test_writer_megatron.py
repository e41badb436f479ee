"""The Megatron ``.idx`` parser: documents from a well-formed index, a named
error for each malformed field, and hostile indexes (fuzzed with hypothesis)
answered with an ``InputError``: no hang, no allocation sized by a count."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from token_inputs_helpers import MEGATRON_MAGIC, megatron_index_bytes
from zephon_stream.errors import InputError
from zephon_stream.writer.megatron import INDEX_HEADER_BYTES, iter_document_bounds, parse_index_header


def document_bounds(data: bytes, *, window: int = 4) -> list[int]:
    """Every document boundary of an in-memory index, read through the streaming parser."""
    header = parse_index_header(data[:INDEX_HEADER_BYTES], size=len(data), name="t.idx")
    bounds: list[int] = []
    for first, chunk in iter_document_bounds(lambda a, b: data[a:b], header, window=window):
        assert first == max(len(bounds) - 1, 0)
        bounds = bounds[:-1] + chunk.tolist() if bounds else chunk.tolist()
    return bounds


@pytest.mark.parametrize("window", [1, 2, 3, 1000])
def test_documents_of_several_sequences_give_token_bounds_for_any_window(window):
    lengths = [3, 0, 5, 2, 2, 7, 1]
    data = megatron_index_bytes(lengths, [0, 2, 3, 3, 6, 7], dtype=np.uint16)
    assert document_bounds(data, window=window) == [0, 3, 8, 8, 19, 20]


def test_empty_index_has_no_documents():
    assert document_bounds(megatron_index_bytes([], [0], dtype=np.int32)) == []
    with pytest.raises(InputError, match=r"t.idx: no documents, but document index entry 0 is 0 and 2 sequences"):
        document_bounds(megatron_index_bytes([1, 1], [0], dtype=np.int32))


def header(version=1, code=8, count=1, entries=2) -> bytes:
    return MEGATRON_MAGIC + struct.pack("<QBQQ", version, code, count, entries)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"MMIDIDX", r"t.idx: 7 bytes, shorter than the 34-byte header"),
        (b"NOTANIDX\x00" + bytes(25), r"t.idx byte 0: magic b'NOTANIDX\\x00', expected b'MMIDIDX\\x00\\x00'"),
        (header(version=2) + bytes(28), r"t.idx byte 9: version 2, expected 1"),
        (header(code=9) + bytes(28), r"t.idx byte 17: dtype code 9, expected one of \[1, 2, 3, 4, 5, 6, 7, 8\]"),
        (header(entries=0), r"t.idx byte 26: document count 0, expected at least 1"),
        (header(count=2**61, entries=2**61),
         r"2305843009213693952 sequences and 2305843009213693952 document entries need \d+ bytes, the file has 34"),
        (header() + bytes(27), r"1 sequences and 2 document entries need 62 bytes, the file has 61"),
        (header() + bytes(29),
         r"need 62 bytes, the file has 63 \(a multimodal index with sequence modes is not supported\)"),
    ],
)  # fmt: skip
def test_malformed_headers_are_named(data, message):
    with pytest.raises(InputError, match=message):
        document_bounds(data)


@pytest.mark.parametrize(
    ("lengths", "pointers", "documents", "message"),
    [
        ([3, 2], None, [1, 2], r"byte 58: document index starts at 1, expected 0"),
        ([3, 2], None, [0, 2, 1], r"byte 74: document index entry 2 is 1, expected between 2 and 2"),
        ([3, 2], None, [0, 5], r"byte 66: document index entry 1 is 5, expected between 0 and 2"),
        ([3, 2], None, [0, 1], r"byte 66: document index ends at 1, expected the sequence count 2"),
        ([3, -2], None, [0, 2], r"byte 38: sequence 1 has length -2, expected >= 0"),
        ([3, 2], [0, 8], [0, 2], r"byte 50: sequence 1 pointer 8, expected 6 \(sequences must lie back to back"),
    ],
)  # fmt: skip
def test_malformed_arrays_are_named_with_their_byte_offset(lengths, pointers, documents, message):
    data = bytearray(megatron_index_bytes(lengths, documents, dtype=np.uint16))
    if pointers is not None:
        data[INDEX_HEADER_BYTES + 4 * len(lengths) : INDEX_HEADER_BYTES + 12 * len(lengths)] = np.asarray(
            pointers, "<i8"
        ).tobytes()
    with pytest.raises(InputError, match=message):
        document_bounds(bytes(data), window=1)


@st.composite
def hostile_indexes(draw) -> bytes:
    """A valid index, then some of its fields or bytes replaced by hostile values."""
    lengths = draw(st.lists(st.integers(0, 50), max_size=12))
    cuts = sorted(draw(st.lists(st.integers(0, len(lengths)), max_size=6)))
    data = bytearray(megatron_index_bytes(lengths, [0, *cuts, len(lengths)], dtype=np.uint16))
    big = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**31, 2**63 - 1, 2**64 - 1]))
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(["version", "code", "count", "entries", "byte", "truncate", "extend"]))
        if field in ("version", "code", "count", "entries") and len(data) < INDEX_HEADER_BYTES:
            continue
        if field == "version":
            struct.pack_into("<Q", data, 9, draw(big))
        elif field == "code":
            struct.pack_into("<B", data, 17, draw(st.integers(0, 255)))
        elif field in ("count", "entries"):
            struct.pack_into("<Q", data, 18 if field == "count" else 26, draw(big))
        elif field == "byte" and len(data):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif field == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        else:
            data += bytes(draw(st.integers(1, 16)))
    return bytes(data)


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_indexes())
def test_hostile_indexes_give_bounds_or_a_clear_error_in_bounded_memory(data):
    tracemalloc.start()
    try:
        bounds = document_bounds(data, window=3)
    except InputError as exc:
        assert "t.idx" in str(exc)
    else:
        assert bounds[0] == 0 and all(b >= a for a, b in zip(bounds, bounds[1:]))
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 1_000_000 + 4 * len(data), f"{peak} bytes allocated for a {len(data)}-byte index"
