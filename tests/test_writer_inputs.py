"""Corpus readers and the writer's accounting: formats, compression, rejects."""

from __future__ import annotations

import gzip
import json
import subprocess

import pytest
import zstandard

from zephon_stream import write_dataset
from zephon_stream.errors import ConfigError, InputError
from zephon_stream.reader import DatasetReader
from zephon_stream.writer.readers import Reject, SourceReader


def records(path, **kwargs):
    return list(SourceReader(str(path), **kwargs))


def documents_of(url):
    """Every document's text, with its (source, record), decoded from the dataset."""
    with DatasetReader.open(url) as reader:
        tok = reader.tokenizer()
        spans = reader.documents(0, reader.manifest.num_tokens) if reader.manifest.num_tokens else []
        out = []
        for span in spans:
            tokens = reader.document_tokens(span)
            assert tokens[-1] == tok.eos_id
            out.append((span.source, span.record, tok.decode(tokens[:-1])))
        return out


def test_txt_whole_file_and_lines(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\r\ntwo\n\nfour")
    assert records(path) == [(0, "one\r\ntwo\n\nfour")]
    got = records(path, lines=True)
    assert [r for r, _ in got] == [0, 1, 2, 3]
    assert got[0][1] == "one" and got[1][1] == "two" and got[3][1] == "four"
    assert isinstance(got[2][1], Reject) and got[2][1].reason == "empty"


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_jsonl_plain_gzip_zstd_give_the_same_records(tmp_path, suffix):
    lines = [json.dumps({"text": f"doc {i}\x00 é", "id": i}) for i in range(50)]
    data = ("\n".join(lines) + "\n").encode()
    if suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    elif suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(data)
    got = records(path)
    assert got == [(i, f"doc {i}\x00 é") for i in range(50)]


def test_jsonl_with_a_byte_order_mark_reads_its_first_line(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"text": "first"}\n{"text": "second"}\n')
    assert records(path) == [(0, "first"), (1, "second")]


def test_every_reject_reason_is_listed_with_its_place(tmp_path):
    path = tmp_path / "mixed.jsonl"
    good = json.dumps({"text": "fine"}).encode()
    path.write_bytes(
        b"\n".join(
            [
                good,  # 0
                b'{"text": "bad \xff byte"}',  # 1 invalid utf-8 at byte len(good)+1+12
                b'{"text": ""}',  # 2 empty
                b'{"body": "x"}',  # 3 missing field
                b'{"text": 7}',  # 4 not a string
                b'{"text": "unterminated',  # 5 malformed
                b"",  # 6 blank line
                b'{"text": "lone \\ud800 surrogate"}',  # 7 invalid utf-8 (lone surrogate)
                b'{"text": null}',  # 8 missing
                b"[1, 2]",  # 9 not an object
                good,  # 10
            ]
        )
    )
    got = records(path)
    assert len(got) == 11 and got[0] == (0, "fine") and got[10] == (10, "fine")
    reasons = {r: item.reason for r, item in got if isinstance(item, Reject)}
    assert reasons == {
        1: "undecodable",
        2: "empty",
        3: "missing_field",
        4: "not_string",
        5: "bad_json",
        6: "bad_json",
        7: "undecodable",
        8: "missing_field",
        9: "bad_json",
    }
    bad_byte = dict(got)[1]
    assert bad_byte.detail == f"invalid UTF-8 at byte {len(good) + 1 + 14}"
    # Records count from 0, the lines a detail names from 1 (record 5 is the sixth line).
    assert dict(got)[5].detail == "line 6: malformed JSON: Unterminated string starting at column 10"
    assert dict(got)[6].detail == "line 7: blank line"
    assert dict(got)[9].detail == "line 10: a JSON list, not an object"

    summary = write_dataset(str(path), str(tmp_path / "out"), tokenizer="bytes", block_tokens=64, progress=False)
    assert summary.records_in == 11 and summary.records_written == 2
    assert summary.rejected == {"bad_json": 3, "empty": 1, "undecodable": 2, "missing_field": 2, "not_string": 1}
    listed = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["source"], r["record"], r["reason"]) for r in listed] == [
        (str(path), rec, reason) for rec, reason in sorted(reasons.items())
    ]
    assert documents_of(str(tmp_path / "out")) == [(str(path), 0, "fine"), (str(path), 10, "fine")]


def test_a_malformed_json_line_is_rejected_with_a_whole_sentence(tmp_path):
    """json's own messages that read on into the position ("Invalid control character at") are completed
    with the column, in rejects.jsonl as in each Reject."""
    path = tmp_path / "bad.jsonl"
    lines = [
        b'{"text": "tab\tinside"}',
        b'{"text": "ok"} and more',
        b'{"text": "ok",}',
        b'{"text": "open',
        b'{"text": "x"}',
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    details = [
        "line 1: malformed JSON: Invalid control character U+0009 at column 14",
        "line 2: malformed JSON: Extra data at column 16",
        "line 3: malformed JSON: Expecting property name enclosed in double quotes at column 15",
        "line 4: malformed JSON: Unterminated string starting at column 10",
    ]
    assert [item.detail for _, item in records(path)[:4]] == details
    summary = write_dataset(str(path), str(tmp_path / "out"), tokenizer="bytes", block_tokens=64, progress=False)
    assert summary.rejected == {"bad_json": 4}
    listed = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [r["detail"] for r in listed] == details


def test_rejects_name_lines_as_editors_count_them_and_records_from_0(tmp_path):
    """A detail's "line N" is the file's N-th line (1-based, as ``sed -n Np`` prints it); ``record`` counts from 0."""
    path = tmp_path / "two.jsonl"
    lines = [b'{"text": "the first line is fine"}', b'{"text": "the second is cut', b"", b'"a string"']
    path.write_bytes(b"\n".join(lines) + b"\n")
    write_dataset(str(path), str(tmp_path / "out"), tokenizer="bytes", block_tokens=64, progress=False)
    listed = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [r["record"] for r in listed] == [1, 2, 3]
    for reject in listed:
        number = int(reject["detail"].split(":", 1)[0].removeprefix("line "))
        assert number == reject["record"] + 1
        printed = subprocess.run(["sed", "-n", f"{number}p", str(path)], capture_output=True, check=True).stdout
        assert printed == lines[reject["record"]] + b"\n"


def test_invalid_utf8_in_a_whole_text_file_is_rejected_with_offset_not_replaced(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"good text")
    (tmp_path / "b.txt").write_bytes(b"abc\xc3(def")
    (tmp_path / "c.txt").write_bytes(b"")
    summary = write_dataset(str(tmp_path / "*.txt"), str(tmp_path / "out"), tokenizer="bytes", progress=False)
    assert (summary.records_in, summary.records_written) == (3, 1)
    listed = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert listed == [
        {"source": str(tmp_path / "b.txt"), "record": 0, "reason": "undecodable", "detail": "invalid UTF-8 at byte 3"},
        {"source": str(tmp_path / "c.txt"), "record": 0, "reason": "empty", "detail": "empty text"},
    ]


def test_parquet_text_column_with_nulls(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"content": ["alpha", None, "", "delta\x00"], "n": [1, 2, 3, 4]})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=2)
    got = records(path, text_field="content")
    assert got[0] == (0, "alpha") and got[3] == (3, "delta\x00")
    assert got[1][1].reason == "missing_field" and got[2][1].reason == "empty"
    with pytest.raises(InputError, match="no column 'text'"):
        records(path)
    with pytest.raises(InputError, match="column 'n' is int64"):
        records(path, text_field="n")


def test_unreadable_inputs_raise_input_error_naming_them(tmp_path):
    with pytest.raises(InputError, match="matches no file"):
        write_dataset(str(tmp_path / "missing.txt"), str(tmp_path / "o1"), tokenizer="bytes", progress=False)
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(InputError, match="x.csv: unknown file type"):
        write_dataset(str(tmp_path / "x.csv"), str(tmp_path / "o2"), tokenizer="bytes", progress=False)
    corrupt = tmp_path / "c.jsonl.gz"
    whole = gzip.compress(b'{"text": "a"}\n' * 20000, mtime=0)
    corrupt.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"c.jsonl.gz: cannot read gzip data at decompressed byte \d+"):
        write_dataset(str(corrupt), str(tmp_path / "o3"), tokenizer="bytes", progress=False)
    garbage = tmp_path / "g.jsonl.zst"
    garbage.write_bytes(b"\x28\xb5\x2f\xfd" + b"\xff" * 64)
    with pytest.raises(InputError, match="g.jsonl.zst: cannot read zstd data"):
        records(garbage)
    assert not (tmp_path / "o3" / "manifest").exists()


def test_truncated_zstd_input_is_an_error_not_a_short_file(tmp_path):
    whole = zstandard.ZstdCompressor().compress(b'{"text": "abc"}\n' * 5000)
    path = tmp_path / "t.jsonl.zst"
    path.write_bytes(whole[:-10])
    with pytest.raises(InputError, match="t.jsonl.zst"):
        records(path)


def test_input_format_override_reads_any_name(tmp_path):
    path = tmp_path / "notes.log"
    path.write_text('{"text": "hello"}\n')
    assert records(path, input_format_override="jsonl") == [(0, "hello")]
    assert records(path, input_format_override="txt") == [(0, '{"text": "hello"}\n')]


def test_existing_dataset_is_not_overwritten_without_asking(tmp_path):
    (tmp_path / "a.txt").write_text("some text")
    out = str(tmp_path / "out")
    write_dataset(str(tmp_path / "a.txt"), out, tokenizer="bytes", progress=False)
    with pytest.raises(ConfigError, match="already holds a committed dataset"):
        write_dataset(str(tmp_path / "a.txt"), out, tokenizer="bytes", progress=False)
    (tmp_path / "a.txt").write_text("other text, longer")
    summary = write_dataset(str(tmp_path / "a.txt"), out, tokenizer="bytes", progress=False, overwrite=True)
    assert summary.num_tokens == len("other text, longer") + 1
    assert documents_of(out) == [(str(tmp_path / "a.txt"), 0, "other text, longer")]


def test_lines_mode_round_trip_with_record_numbers(tmp_path):
    path = tmp_path / "l.txt.gz"
    path.write_bytes(gzip.compress(b"first\nsecond\n\nfourth\n", mtime=0))
    out = str(tmp_path / "out")
    summary = write_dataset(str(path), out, tokenizer="bytes", lines=True, progress=False)
    assert summary.rejected == {"empty": 1}
    assert documents_of(out) == [(str(path), 0, "first"), (str(path), 1, "second"), (str(path), 3, "fourth")]


def test_all_records_rejected_commits_an_empty_dataset_only_when_asked(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"")
    (tmp_path / "b.jsonl").write_text('{"x": 1}\n')
    out = tmp_path / "out"
    inputs = [str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")]
    with pytest.raises(InputError, match=r"all 2 records of 2 inputs were rejected \(empty 1, missing_field 1\)"):
        write_dataset(inputs, str(out), tokenizer="bytes", progress=False)
    assert not (out / "manifest").exists() and len((out / "rejects.jsonl").read_text().splitlines()) == 2
    summary = write_dataset(inputs, str(out), tokenizer="bytes", progress=False, allow_empty=True)
    assert (summary.records_in, summary.num_tokens, summary.num_shards) == (2, 0, 0)
    from zephon_stream import Manifest

    manifest = Manifest.load(str(out))
    assert manifest.num_rejected == 2 and [s.num_records for s in manifest.sources] == [1, 1]
    assert len((out / "rejects.jsonl").read_text().splitlines()) == 2


def test_progress_bar_reports_bytes_read_when_asked(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("x" * 5000)
    write_dataset(str(tmp_path / "a.txt"), str(tmp_path / "out"), tokenizer="bytes", progress=True)
    err = capsys.readouterr().err
    assert "write:" in err and "100%" in err and "4.88k" in err


@pytest.mark.parametrize("kind", ["jsonl.gz", "jsonl.zst", "parquet"])
def test_compressed_and_parquet_inputs_round_trip(stdlib_corpus, tmp_path, kind):
    texts = list(stdlib_corpus.texts[:15])
    path = tmp_path / f"corpus.{kind}"
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts}), path, row_group_size=4)
    else:
        raw = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
        path.write_bytes(
            gzip.compress(raw, mtime=0) if kind.endswith("gz") else zstandard.ZstdCompressor().compress(raw)
        )
    out = str(tmp_path / "out")
    summary = write_dataset(str(path), out, tokenizer="bytes", block_tokens=4097, blocks_per_shard=2, progress=False)
    assert summary.num_shards > 1
    assert documents_of(out) == [(str(path), i, t) for i, t in enumerate(texts)]
