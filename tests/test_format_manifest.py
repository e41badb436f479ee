"""Manifest codec: canonical bytes, validation, block arithmetic, fuzzing."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_format_dataset import BYTES_TOKENIZER, byte_docs, make_dataset
from zephon_stream.errors import FormatError, ManifestError, ObjectMissingError, PathEscapeError, VersionError
from zephon_stream.format.manifest import Manifest, ShardInfo, SourceInfo, compute_fingerprint


def shard(index: int, num_tokens: int, block_tokens: int, *, frame_bytes: int = 100) -> ShardInfo:
    blocks = -(-num_tokens // block_tokens)
    return ShardInfo(
        path=f"shards/{index:08d}.zst",
        num_tokens=num_tokens,
        num_bytes=blocks * frame_bytes,
        sha256=hashlib.sha256(b"shard %d" % index).hexdigest(),
        block_offsets=tuple(range(0, blocks * frame_bytes + 1, frame_bytes)),
        index_path=f"shards/{index:08d}.idx",
        index_sha256=hashlib.sha256(b"idx %d" % index).hexdigest(),
        num_documents=2,
    )


def merged_manifest() -> Manifest:
    """Two parts merged: each part's last shard (and its last block) is short."""
    bt = 10
    shards = [shard(0, 30, bt), shard(1, 25, bt), shard(2, 30, bt), shard(3, 7, bt)]
    sources = [
        SourceInfo(path="part0.jsonl", num_records=5, num_documents=4, num_rejected=1),
        SourceInfo(path="s3://in/part1.jsonl", num_records=4, num_documents=4, num_rejected=0),
    ]
    # The codec of format 1.0, every entry inline (1.1's is in test_format_index.py).
    return Manifest.create(
        tokenizer=BYTES_TOKENIZER, block_tokens=bt, blocks_per_shard=3, shards=shards, sources=sources, version=(1, 0)
    )


def raw(manifest: Manifest) -> dict:
    return msgpack.unpackb(manifest.to_bytes())


def test_round_trip_and_canonical_bytes() -> None:
    manifest = merged_manifest()
    data = manifest.to_bytes()
    back = Manifest.from_bytes(data, where="m")
    assert back == manifest
    assert back.to_bytes() == data
    assert list(msgpack.unpackb(data)) == [
        "format",
        "version",
        "dtype",
        "tokenizer",
        "block_tokens",
        "blocks_per_shard",
        "num_tokens",
        "num_blocks",
        "num_documents",
        "num_rejected",
        "compressed_bytes",
        "shards",
        "sources",
        "rejects_path",
        "fingerprint",
    ]


def test_key_order_does_not_matter_when_reading() -> None:
    obj = raw(merged_manifest())
    shuffled = dict(reversed(list(obj.items())))
    assert Manifest.from_bytes(msgpack.packb(shuffled), where="m") == merged_manifest()


def test_totals_and_dtype_are_derived() -> None:
    m = merged_manifest()
    assert (m.num_shards, m.num_tokens, m.num_blocks, m.num_documents, m.num_rejected) == (4, 92, 10, 8, 1)
    assert m.dtype == "uint16" and m.np_dtype == np.dtype("<u2")
    assert m.compressed_bytes == 1000


def test_block_arithmetic_with_short_shards_from_a_merge() -> None:
    m = merged_manifest()
    counts = m.block_token_counts()
    assert counts.dtype == np.int64
    assert counts.tolist() == [10, 10, 10, 10, 10, 5, 10, 10, 10, 7]
    assert m.block_location(5) == (1, 2)
    assert m.block_location(6) == (2, 0)
    assert m.block_byte_range(5) == ("shards/00000001.zst", 200, 300)
    assert m.block_num_tokens(5) == 5
    assert m.token_offset_of_block(6) == 55
    assert m.token_offset_of_block(9) == 85
    assert m.block_where(9) == "shard shards/00000003.zst block 0 (bytes 0..100)"
    with pytest.raises(IndexError):
        m.block_location(m.num_blocks)
    with pytest.raises(ValueError):
        counts[0] = 0
    assert m.block_token_counts() is counts
    assert m.block_token_starts.tolist() == [0, 10, 20, 30, 40, 50, 55, 65, 75, 85, 92]
    with pytest.raises(ValueError):
        m.block_token_starts[0] = 1


def test_uint32_dtype_for_large_vocab() -> None:
    tok = dataclasses.replace(BYTES_TOKENIZER, vocab_size=65537, eos_id=65536)
    source = SourceInfo(path="a.txt", num_records=2, num_documents=2, num_rejected=0)
    m = Manifest.create(tokenizer=tok, block_tokens=10, blocks_per_shard=3, shards=[shard(0, 30, 10)], sources=[source])
    assert m.dtype == "uint32"
    tok = dataclasses.replace(BYTES_TOKENIZER, vocab_size=65536, eos_id=65535)
    assert Manifest.create(tokenizer=tok, block_tokens=10, blocks_per_shard=3, shards=[], sources=[]).dtype == "uint16"


def test_fingerprint_follows_the_documented_rule() -> None:
    m = merged_manifest()
    text = "zephon-stream dataset fingerprint\nformat_major=1\ndtype=uint16\ntokenizer=bytes-v1\nblock_tokens=10\n"
    text += "".join(f"shard={s.num_tokens} {s.sha256}\n" for s in m.shards)
    assert m.fingerprint == hashlib.sha256(text.encode()).hexdigest()
    assert (
        compute_fingerprint(
            dtype="uint16",
            tokenizer_fingerprint="bytes-v1",
            block_tokens=10,
            shards=[(s.num_tokens, s.sha256) for s in m.shards],
        )
        == m.fingerprint
    )


def test_fingerprint_changes_with_content() -> None:
    base = dict(dtype="uint16", tokenizer_fingerprint="t", block_tokens=10, shards=[(5, "a" * 64)])
    fp = compute_fingerprint(**base)
    assert fp != compute_fingerprint(**{**base, "block_tokens": 11})
    assert fp != compute_fingerprint(**{**base, "tokenizer_fingerprint": "u"})
    assert fp != compute_fingerprint(**{**base, "shards": [(5, "b" * 64)]})
    assert fp != compute_fingerprint(**{**base, "shards": [(5, "a" * 64), (1, "a" * 64)]})


@pytest.mark.parametrize(
    "path", ["../x", "shards/../../x", "/abs/x", "s3://b/x", "file:x", "C:/x", "a\\b", "a//b", "a/./b", "", "x/"]
)
def test_escaping_shard_path_is_refused_naming_path_and_manifest(path: str) -> None:
    obj = raw(merged_manifest())
    obj["shards"][1]["path"] = path
    with pytest.raises(PathEscapeError, match="manifest s3://bkt/ds/manifest") as info:
        Manifest.from_bytes(msgpack.packb(obj), where="manifest s3://bkt/ds/manifest")
    assert repr(path[:200]) in str(info.value)


@pytest.mark.parametrize("field", ["index_path", "rejects_path"])
def test_escaping_index_and_rejects_paths_are_refused(field: str) -> None:
    obj = raw(merged_manifest())
    target = obj if field == "rejects_path" else obj["shards"][0]
    target[field] = "../outside"
    with pytest.raises(PathEscapeError, match="'../outside'"):
        Manifest.from_bytes(msgpack.packb(obj), where="m")


def test_unknown_major_version_is_a_version_error() -> None:
    obj = raw(merged_manifest())
    obj["version"] = [2, 0]
    obj["shards"] = "a future layout"
    with pytest.raises(VersionError, match="unknown major version 2"):
        Manifest.from_bytes(msgpack.packb(obj), where="m")


def test_higher_minor_version_is_accepted_and_unknown_keys_ignored() -> None:
    obj = raw(merged_manifest())
    obj["version"] = [1, 7]
    obj["added_in_1_7"] = {"anything": [1, 2]}
    m = Manifest.from_bytes(msgpack.packb(obj), where="m")
    assert m.version == (1, 7) and m.num_tokens == 92


@pytest.mark.parametrize(
    "junk",
    [b"", b"\xc1", b"\x93\x01\x02", b"\xdf\xff\xff\xff\xff", b"\x81\x01\x02", b"{json: 1}", b"\x80" + b"\x00" * 5],
)
def test_malformed_msgpack_is_a_manifest_error(junk: bytes) -> None:
    with pytest.raises(ManifestError, match="manifest at x"):
        Manifest.from_bytes(junk, where="manifest at x")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: o.update(format="other"), "field 'format' is 'other'"),
        (lambda o: o.update(num_tokens=93), "num_tokens: declared 93, but the sum over shards is 92"),
        (
            lambda o: o.update(num_blocks=10**18),
            "num_blocks: declared 1000000000000000000, but the sum over shards is 10",
        ),
        (lambda o: o.update(num_documents=7), "num_documents: declared 7"),
        (lambda o: o.update(num_rejected=0), "num_rejected: declared 0, but the sum over sources is 1"),
        (lambda o: o.update(compressed_bytes=1), "compressed_bytes: declared 1"),
        (lambda o: o.update(dtype="uint32"), "dtype: declared 'uint32', but vocab_size 257 requires 'uint16'"),
        (lambda o: o.update(dtype="int8"), "dtype: 'int8' is not one of"),
        (lambda o: o.update(block_tokens=1), "block_tokens: value 1 is outside"),
        (lambda o: o.update(block_tokens=-5), "block_tokens.*outside"),
        (lambda o: o.update(blocks_per_shard=True), "expected an integer, got bool"),
        (lambda o: o.update(fingerprint="0" * 64), "fingerprint: declared 0000"),
        (
            lambda o: o["shards"][0].update(block_offsets=[0, 100, 100, 300]),
            r"block_offsets\[2\]: 100 does not increase",
        ),
        (
            lambda o: o["shards"][0].update(block_offsets=[0, 100, 300]),
            "has 3 entries, but 30 tokens in blocks of 10 make 3 blocks",
        ),
        (lambda o: o["shards"][0].update(block_offsets=[5, 100, 200, 300]), r"block_offsets\[0\]: is 5, expected 0"),
        (
            lambda o: o["shards"][0].update(block_offsets=[0, 100, 200, 299]),
            r"block_offsets\[-1\]: is 299, expected num_bytes 300",
        ),
        (lambda o: o["shards"][0].update(num_tokens=40), "4 blocks.*more than blocks_per_shard 3|has 4 entries"),
        (lambda o: o["shards"][0].update(sha256="XYZ"), "expected 64 lowercase hex digits"),
        (lambda o: o["shards"][1].update(path="shards/00000000.zst"), "is also used by shards"),
        (lambda o: o["sources"][0].update(num_records=9), r"num_records 9 != num_documents 4 \+ num_rejected 1"),
        (lambda o: o["tokenizer"].update(eos_id=257), "tokenizer.eos_id: value 257 is outside"),
        (lambda o: o.pop("shards"), "missing field 'shards'"),
        (lambda o: o["tokenizer"].update(vocab_size=2.5), "expected an integer, got float"),
        (lambda o: o.update(version=[1]), "expected \\[major, minor\\]"),
    ],
)
def test_inconsistent_manifest_names_field_and_values(mutate, message: str) -> None:
    obj = raw(merged_manifest())
    mutate(obj)
    with pytest.raises(ManifestError, match=message):
        Manifest.from_bytes(msgpack.packb(obj), where="m")


def test_constructing_an_inconsistent_manifest_is_refused() -> None:
    good = merged_manifest()
    with pytest.raises(ManifestError, match="num_tokens: declared 1"):
        dataclasses.replace(good, num_tokens=1)
    with pytest.raises(ManifestError, match="expected an integer, got int64"):
        dataclasses.replace(good, block_tokens=np.int64(10))


def test_empty_dataset_is_valid() -> None:
    m = Manifest.create(
        tokenizer=BYTES_TOKENIZER,
        block_tokens=10,
        blocks_per_shard=2,
        shards=[],
        sources=[SourceInfo(path="empty.txt", num_records=1, num_documents=0, num_rejected=1)],
    )
    objects = m.objects()
    assert Manifest.from_bytes(objects["manifest"], where="m", read=objects.__getitem__).num_blocks == 0
    assert m.block_token_counts().tolist() == []


def test_load_reads_a_committed_local_dataset(tmp_path: Path) -> None:
    written = make_dataset(tmp_path, byte_docs(4))
    assert Manifest.load(str(tmp_path)) == written


def test_load_without_manifest_says_no_committed_dataset(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    with pytest.raises(ObjectMissingError, match="no committed dataset at"):
        Manifest.load(str(tmp_path))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_fuzz_random_bytes_only_raise_manifest_errors(data: bytes) -> None:
    try:
        Manifest.from_bytes(data, where="fuzz")
    except ManifestError:
        pass


VALID = merged_manifest().to_bytes()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, len(VALID)),
)
def test_fuzz_mutated_manifests_only_raise_format_errors(edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(VALID)
    for at, value in edits:
        data[at] = value
    for candidate in (bytes(data), bytes(data[:cut])):
        try:
            Manifest.from_bytes(candidate, where="fuzz")
        except FormatError:
            pass


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(raw(merged_manifest()))), json_like)
def test_fuzz_replaced_fields_only_raise_manifest_errors(key: str, value) -> None:
    obj = raw(merged_manifest())
    obj[key] = value
    try:
        data = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    try:
        Manifest.from_bytes(data, where="fuzz")
    except ManifestError:
        pass


def with_first_entry_changed(good: Manifest, entries: str, field: str, value) -> Manifest:
    """``good`` with field ``field`` of its first ``entries`` item set to ``value``,
    built without the constructor's checks (what a decoder in bulk could be handed)."""
    items = list(getattr(good, entries))
    items[0] = dataclasses.replace(items[0], **{field: value})
    bad = object.__new__(Manifest)
    bad.__dict__.update(good.__dict__)
    object.__setattr__(bad, entries, tuple(items))
    return bad


@pytest.mark.parametrize(
    "field, value",
    [
        ("path", "../x"),
        ("path", "a//b"),
        ("path", "s3:x"),
        ("path", ""),
        ("path", 7),
        ("path", "a/./b"),
        ("path", "x" * 5000),
        ("path", "shards/00000001.zst"),
        ("path", "rejects.jsonl"),
        ("index_path", "/abs"),
        ("num_tokens", 0),
        ("num_tokens", True),
        ("num_tokens", 2**64),
        ("num_tokens", 30.0),
        ("num_tokens", 40),
        ("num_bytes", 299),
        ("num_bytes", -1),
        ("num_documents", -1),
        ("num_documents", False),
        ("sha256", "XYZ"),
        ("sha256", "A" * 64),
        ("index_sha256", None),
        ("block_offsets", (0, 100, 100, 300)),
        ("block_offsets", (5, 100, 200, 300)),
        ("block_offsets", (0, 100, 300)),
        ("block_offsets", (0, 100, 200.0, 300)),
        ("block_offsets", (0, 100, True, 300)),
        ("block_offsets", [0, 100, 200, 300]),
        ("block_offsets", (0, 200, 100, 300)),
        ("block_offsets", (0, 100, 200, 2**64)),
    ],
)
def test_bulk_shard_checks_refuse_what_the_per_shard_checks_refuse(field: str, value) -> None:
    from zephon_stream.format import validation

    good = merged_manifest()
    bad = with_first_entry_changed(good, "shards", field, value)
    assert validation._shards_pass(good)
    assert not validation._shards_pass(bad)
    with pytest.raises(ManifestError):
        validation.validate_manifest(bad)


@pytest.mark.parametrize(
    "field, value",
    [
        ("path", ""),
        ("path", 3),
        ("num_records", 9),
        ("num_records", -1),
        ("num_documents", True),
        ("num_rejected", 1.0),
    ],
)
def test_bulk_source_checks_refuse_what_the_per_source_checks_refuse(field: str, value) -> None:
    from zephon_stream.format import validation

    good = merged_manifest()
    bad = with_first_entry_changed(good, "sources", field, value)
    assert validation._sources_pass(good)
    assert not validation._sources_pass(bad)
    with pytest.raises(ManifestError):
        validation.validate_manifest(bad)


def test_a_manifest_decoded_in_bulk_equals_one_decoded_field_by_field() -> None:
    good = merged_manifest()
    decoded = Manifest.from_bytes(good.to_bytes())
    assert decoded == good and decoded.shards == good.shards and decoded.sources == good.sources
    assert all(type(s.block_offsets) is tuple for s in decoded.shards)
