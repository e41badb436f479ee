"""Work units (no Ray): how inputs are cut, and that a unit's part reads the
records the whole file gives, numbered and placed as the whole file does."""

from __future__ import annotations

import json

import pytest

from zephon_stream.errors import InputError
from zephon_stream.writer.config import WriteConfig
from zephon_stream.writer.readers import Reject, SourceReader
from zephon_stream.writer.units import InputPiece, WorkUnit, cut_units, unit_key


def _records(reader: SourceReader) -> list[tuple[int, object]]:
    return [(n, item.to_json() if isinstance(item, Reject) else item) for n, item in reader]


def test_a_large_jsonl_file_is_cut_at_line_starts_and_its_ranges_read_as_the_whole_file(stdlib_corpus, tmp_path):
    lines = [json.dumps({"text": t}) for t in stdlib_corpus.texts[:50]]
    lines[7] = "{broken"
    lines[20] = json.dumps({"text": "bad \udc80 surrogate"})
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")  # No newline at the end
    data = path.read_bytes()
    units = cut_units([str(path)], config=WriteConfig(), unit_bytes=40_000)
    ranges = [u.pieces[0].byte_range for u in units]
    assert len(units) > 3 and all(len(u.pieces) == 1 for u in units)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] and data[b[0] - 1 : b[0]] == b"\n" for a, b in zip(ranges, ranges[1:]))
    assert [u.pieces[0].first_record for u in units] == [data[: r[0]].count(b"\n") for r in ranges]
    whole = _records(SourceReader(str(path)))
    pieces = []
    for unit in units:
        piece = unit.pieces[0]
        pieces += _records(SourceReader(str(path), byte_range=piece.byte_range, first_record=piece.first_record))
    assert pieces == whole and len(whole) == 50


def test_small_files_share_units_and_compressed_streams_stay_whole(stdlib_corpus, tmp_path):
    import gzip

    paths = []
    for i, text in enumerate(stdlib_corpus.texts[:12]):
        path = tmp_path / f"{i:02d}.py"
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    big = tmp_path / "z.jsonl.gz"
    big.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in stdlib_corpus.texts).encode()))
    paths.append(str(big))
    unit_bytes = 30_000
    units = cut_units(paths, config=WriteConfig(), unit_bytes=unit_bytes)
    assert [p.url for u in units for p in u.pieces] == paths
    assert [u.index for u in units] == list(range(len(units)))
    assert units[-1].pieces == (
        InputPiece(url=str(big), num_bytes=big.stat().st_size, modified_ns=big.stat().st_mtime_ns),
    )
    grouped = units[:-1]
    assert len(grouped) < 12 and all(u.num_bytes <= unit_bytes or len(u.pieces) == 1 for u in grouped)


def test_parquet_row_groups_are_cut_into_runs_numbered_by_row(stdlib_corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = list(stdlib_corpus.texts[:40])
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=3)
    units = cut_units([str(path)], config=WriteConfig(), unit_bytes=20_000)
    groups = [u.pieces[0].row_groups for u in units]
    assert len(units) > 2 and groups[0][0] == 0 and groups[-1][1] == 14
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    read = []
    for unit in units:
        piece = unit.pieces[0]
        read += _records(SourceReader(str(path), row_groups=piece.row_groups, first_record=piece.first_record))
    assert read == _records(SourceReader(str(path))) and [n for n, _ in read] == list(range(40))


def test_a_unit_key_changes_with_its_inputs_and_settings():
    unit = WorkUnit(index=0, pieces=(InputPiece(url="/a.jsonl", num_bytes=10, byte_range=(0, 10)),))
    moved = WorkUnit(index=0, pieces=(InputPiece(url="/a.jsonl", num_bytes=10, byte_range=(0, 11)),))
    settings = {"tokenizer": "x", "block_tokens": 4097}
    assert unit_key(unit, settings) == unit_key(unit, dict(settings))
    assert unit_key(unit, settings) != unit_key(moved, settings)
    assert unit_key(unit, settings) != unit_key(unit, {**settings, "block_tokens": 8193})
    touched = WorkUnit(index=0, pieces=(InputPiece(url="/a.jsonl", num_bytes=10, byte_range=(0, 10), modified_ns=1),))
    assert unit_key(unit, settings) != unit_key(touched, settings)


def test_byte_ranges_are_refused_for_inputs_that_cannot_be_split(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(b"")
    with pytest.raises(InputError, match="split by byte range"):
        SourceReader(str(path), byte_range=(0, 1))
    with pytest.raises(InputError, match="split by byte range"):
        SourceReader(str(tmp_path / "b.txt"), byte_range=(0, 1))


def test_engine_settings_that_do_not_apply_are_refused_before_anything_starts(tmp_path):
    from zephon_stream import write_dataset
    from zephon_stream.errors import ConfigError

    src = tmp_path / "a.txt"
    src.write_text("text", encoding="utf-8")
    out = str(tmp_path / "out")
    with pytest.raises(ConfigError, match="engine 'spark' is not one of pool, ray"):
        write_dataset(str(src), out, tokenizer="bytes", engine="spark")
    with pytest.raises(ConfigError, match="apply to engine='ray' only"):
        write_dataset(str(src), out, tokenizer="bytes", ray_workers=2)
    with pytest.raises(ConfigError, match="set ray_workers instead"):
        write_dataset(str(src), out, tokenizer="bytes", engine="ray", workers=2)
    with pytest.raises(ConfigError, match="unit_bytes 0"):
        cut_units([str(src)], config=WriteConfig(), unit_bytes=0)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_units_tokenizer_error_names_the_tokenizer_and_commits_nothing(stdlib_corpus, tmp_path):
    import numpy as np

    from zephon_stream.errors import TokenizerError
    from zephon_stream.writer.tokenizers import BytesTokenizer
    from zephon_stream.writer.unit_part import UNIT_RECORD_NAME, UnitSpec, convert_unit

    class OutOfRangeAfterTwoChunks(BytesTokenizer):
        """Encodes as bytes, then gives id 300 from its third chunk on (on the unit's tokenizer thread)."""

        chunks = 0

        def encode_documents(self, texts):
            OutOfRangeAfterTwoChunks.chunks += 1
            if self.chunks <= 2:
                return super().encode_documents(texts)
            return np.array([300, self.eos_id], dtype=np.int64), np.array([2], dtype=np.int64)

    paths = []
    for i, text in enumerate(stdlib_corpus.texts[:40]):
        (tmp_path / f"{i:02d}.py").write_text(text, encoding="utf-8")
        paths.append(str(tmp_path / f"{i:02d}.py"))
    config = WriteConfig(chunk_chars=20_000).resolved()
    (unit,) = cut_units(paths, config=config, unit_bytes=1 << 30)
    spec = UnitSpec(output=str(tmp_path / "out"), config=config, tokenizer=OutOfRangeAfterTwoChunks())
    with pytest.raises(TokenizerError, match="produced id 300"):
        convert_unit(unit, spec, name="part-00000-of-00001", key="k")
    assert OutOfRangeAfterTwoChunks.chunks > 2
    assert not (tmp_path / "out" / "part-00000-of-00001" / UNIT_RECORD_NAME).exists()
