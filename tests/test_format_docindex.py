"""Document-index sidecars: codec, validation, and lookup across shards."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_format_dataset import byte_docs, make_dataset
from zephon_stream.errors import FormatError
from zephon_stream.format.docindex import DocIndex, DocumentLocator
from zephon_stream.format.spec import index_name


def test_docindex_round_trip() -> None:
    index = DocIndex.build(
        doc_starts=[0, 17, 400], doc_source=[0, 1, 1], doc_record=[5, 0, 2**40], sources=["a.txt", "b.jsonl"]
    )
    data = index.to_bytes()
    back = DocIndex.from_bytes(data, where="shards/00000000.idx", shard_num_tokens=1000)
    assert back.num_documents == 3
    assert back.doc_starts.tolist() == [0, 17, 400]
    assert back.doc_source.tolist() == [0, 1, 1]
    assert back.doc_record.tolist() == [5, 0, 2**40]
    assert back.sources == ("a.txt", "b.jsonl")
    assert back.to_bytes() == data
    raw = msgpack.unpackb(data)
    assert raw["doc_starts"] == np.array([0, 17, 400], "<u8").tobytes()
    assert raw["version"] == [1, 0]


def test_empty_docindex_for_a_shard_inside_one_long_document() -> None:
    data = DocIndex.build(doc_starts=[], doc_source=[], doc_record=[], sources=[]).to_bytes()
    assert DocIndex.from_bytes(data, where="x").num_documents == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"doc_starts": np.array([0, 5, 5], "<u8").tobytes()}, r"doc_starts\[2\] = 5 does not increase"),
        ({"doc_starts": b"\x00" * 7}, "7 bytes, expected 24"),
        ({"doc_source": np.array([0, 0, 3], "<u4").tobytes()}, r"doc_source\[2\] = 3 is outside the 2 sources"),
        ({"num_documents": 4}, "expected 32"),
        ({"version": [2, 0]}, "unknown major version 2"),
        ({"sources": ["a", 7]}, "entry 1"),
        ({"doc_record": "text"}, "expected msgpack bin"),
    ],
)
def test_bad_docindex_is_a_format_error_naming_the_field(change: dict, message: str) -> None:
    raw = msgpack.unpackb(
        DocIndex.build(doc_starts=[0, 5, 9], doc_source=[0, 1, 0], doc_record=[0, 0, 1], sources=["a", "b"]).to_bytes()
    )
    raw.update(change)
    with pytest.raises(FormatError, match=message):
        DocIndex.from_bytes(msgpack.packb(raw), where="shards/00000004.idx")


def test_doc_start_past_the_shard_end_is_refused() -> None:
    data = DocIndex.build(doc_starts=[0, 50], doc_source=[0, 0], doc_record=[0, 1], sources=["a"]).to_bytes()
    with pytest.raises(FormatError, match="past the shard's 50 tokens"):
        DocIndex.from_bytes(data, where="x", shard_num_tokens=50)


@pytest.mark.parametrize("junk", [b"", b"\xc1", b"\x92\x01", msgpack.packb([1, 2]), b"\xdd\xff\xff\xff\xff"])
def test_malformed_docindex_is_a_format_error(junk: bytes) -> None:
    with pytest.raises(FormatError, match="shards/00000001.idx"):
        DocIndex.from_bytes(junk, where="shards/00000001.idx")


def _locator(root: Path, manifest) -> DocumentLocator:
    def load(shard: int) -> DocIndex:
        info = manifest.shards[shard]
        return DocIndex.from_bytes(
            (root / info.index_path).read_bytes(), where=info.index_path, shard_num_tokens=info.num_tokens
        )

    return DocumentLocator([s.num_tokens for s in manifest.shards], load)


def test_lookup_finds_every_document_with_its_tokens(tmp_path: Path) -> None:
    docs = byte_docs(10)
    manifest = make_dataset(tmp_path, docs, block_tokens=700, blocks_per_shard=2)
    locator = _locator(tmp_path, manifest)
    spans = locator.documents(0, manifest.num_tokens)
    assert [(s.source, s.token_end - s.token_start) for s in spans] == [(n, len(t)) for n, t in docs]
    assert spans[0].token_start == 0 and spans[-1].token_end == manifest.num_tokens
    assert all(a.token_end == b.token_start for a, b in zip(spans, spans[1:]))


def test_lookup_walks_back_to_a_document_started_in_an_earlier_shard(tmp_path: Path) -> None:
    # One long document spans several shards: the later shards' sidecars are empty.
    names = [("long.py", np.append(np.arange(5000) % 256, 256)), ("short.py", np.array([65, 66, 256]))]
    manifest = make_dataset(
        tmp_path, [(n, t.astype(np.uint16)) for n, t in names], block_tokens=600, blocks_per_shard=2
    )
    assert manifest.num_shards == 5
    assert DocIndex.from_bytes((tmp_path / index_name(2)).read_bytes(), where="x").num_documents == 0
    locator = _locator(tmp_path, manifest)
    (span,) = locator.documents_in_shard(2, 10, 20)
    assert (span.source, span.record, span.token_start, span.token_end, span.shard_index) == ("long.py", 0, 0, 5001, 0)
    spans = locator.documents_in_shard(4, 0, manifest.shards[4].num_tokens)
    assert [s.source for s in spans] == ["long.py", "short.py"]
    assert spans[1].token_start == 5001 and spans[1].token_end == 5004 and spans[1].shard_index == 4
    assert spans[1].shard_offset == 5001 - 4 * 1200


def test_lookup_range_outside_the_dataset_is_an_index_error(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path, byte_docs(3))
    locator = _locator(tmp_path, manifest)
    with pytest.raises(IndexError):
        locator.documents(0, manifest.num_tokens + 1)
    with pytest.raises(IndexError):
        locator.documents(5, 5)


VALID_INDEX = DocIndex.build(
    doc_starts=[0, 9, 40], doc_source=[0, 1, 0], doc_record=[0, 3, 1], sources=["a", "b"]
).to_bytes()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, len(VALID_INDEX) - 1), st.integers(0, 255)), max_size=6),
    st.integers(0, len(VALID_INDEX)),
    st.binary(max_size=64),
)
def test_fuzz_docindex_only_raises_format_errors(edits, cut: int, junk: bytes) -> None:
    data = bytearray(VALID_INDEX)
    for at, value in edits:
        data[at] = value
    for candidate in (bytes(data), bytes(data[:cut]), junk):
        try:
            index = DocIndex.from_bytes(candidate, where="fuzz", shard_num_tokens=100)
        except FormatError:
            continue
        assert index.num_documents == len(index.doc_source) == len(index.doc_record)
        assert all(int(s) < 100 for s in index.doc_starts)


def test_building_from_negative_or_oversized_values_is_refused() -> None:
    with pytest.raises(FormatError, match="doc_starts must hold integers"):
        DocIndex.build(doc_starts=[-1], doc_source=[0], doc_record=[0], sources=["a"])
    with pytest.raises(FormatError, match="doc_source must hold integers"):
        DocIndex.build(doc_starts=[0], doc_source=[2**32], doc_record=[0], sources=["a"])
