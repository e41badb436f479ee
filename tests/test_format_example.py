"""The worked example of docs/FORMAT.md, rebuilt and checked byte for byte."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import numpy as np

from test_format_dataset import make_dataset
from zephon_stream.format.manifest import TokenizerInfo
from zephon_stream.reader import DatasetReader

BYTES_FINGERPRINT = "ac3165c03a01dfcf1b091bee99e4e6bcc709bda10d6733c5b5daa1eaa7d9372c"
FORMAT_MD = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"


def build_example(root: Path, version: tuple[int, int] = (1, 0)):
    tok = TokenizerInfo(
        kind="bytes", name="bytes", vocab_size=257, eos_id=256, bos_id=None, fingerprint=BYTES_FINGERPRINT
    )
    docs = [("a.txt", b"hello"), ("a.txt", b"hi"), ("b.txt", b"zephon stream")]
    docs = [(name, np.append(np.frombuffer(text, np.uint8), 256).astype(np.uint16)) for name, text in docs]
    return make_dataset(root, docs, tokenizer=tok, block_tokens=5, blocks_per_shard=2, version=version)


def test_worked_example_matches_the_spec(tmp_path: Path) -> None:
    m = build_example(tmp_path)
    assert (m.num_tokens, m.num_blocks, m.num_shards, m.compressed_bytes) == (23, 5, 3, 111)
    assert m.block_token_counts().tolist() == [5, 5, 5, 5, 3]
    assert [s.block_offsets for s in m.shards] == [(0, 23, 46), (0, 23, 46), (0, 19)]
    frame = (tmp_path / "shards/00000000.zst").read_bytes()[:23]
    assert frame.hex(" ") == "28 b5 2f fd 24 0a 51 00 00 68 00 65 00 6c 00 6c 00 6f 00 78 eb 04 ac"
    assert m.block_byte_range(3) == ("shards/00000001.zst", 23, 46)
    assert m.token_offset_of_block(3) == 15
    assert m.fingerprint.startswith("644f9a6b") and m.fingerprint.endswith("9b91ad")
    text = (
        "zephon-stream dataset fingerprint\nformat_major=1\ndtype=uint16\n"
        f"tokenizer={BYTES_FINGERPRINT}\nblock_tokens=5\n"
        + "".join(f"shard={s.num_tokens} {s.sha256}\n" for s in m.shards)
    )
    assert hashlib.sha256(text.encode()).hexdigest() == m.fingerprint
    assert m.to_bytes()[:12].hex(" ") == "8f a6 66 6f 72 6d 61 74 ad 7a 65 70"
    sidecar = msgpack.unpackb((tmp_path / "shards/00000000.idx").read_bytes())
    assert sidecar["doc_starts"].hex() == "000000000000000006000000000000000900000000000000"
    assert sidecar["doc_source"].hex() == "000000000000000001000000"
    assert sidecar["sources"] == ["a.txt", "b.txt"]
    with DatasetReader.open(str(tmp_path)) as reader:
        (span,) = reader.documents(20, 23)
    assert (span.source, span.record, span.token_start, span.token_end, span.shard_index) == ("b.txt", 0, 9, 23, 0)


def test_spec_quotes_the_example_values() -> None:
    spec = FORMAT_MD.read_text()
    for quoted in (
        "28 b5 2f fd",
        "78 eb 04 ac",
        "block_offsets = [0, 23, 46]",
        "644f9a6b...9b91ad",
        BYTES_FINGERPRINT,
        "shard=3 bf03bcd24dc996aa41ac8af4956e5ea70ce4310339dd4e4bf9284c2a053ca501",
    ):
        assert quoted in spec
