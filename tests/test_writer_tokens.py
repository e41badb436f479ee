"""Pre-tokenized inputs (``--input-format tokens``): the stdlib corpus
tokenized with the BPE fixture, written as .npy, raw .bin, Megatron .bin/.idx,
Parquet, JSONL and a ``datasets`` folder by numpy, pyarrow and ``datasets``,
comes back token for token, with the text path's bytes, for any --workers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from token_inputs_helpers import (
    token_stream,
    with_eos,
    write_datasets,
    write_jsonl,
    write_megatron,
    write_parquet,
)
from zephon_stream import Manifest, write_dataset
from zephon_stream.cli import main
from zephon_stream.errors import ConfigError, InputError
from zephon_stream.format.spec import REJECTS_NAME
from zephon_stream.reader import DatasetReader
from zephon_stream.writer.tokenizers import load_tokenizer

NUM_DOCS = 120
SMALL = {"block_tokens": 4097, "blocks_per_shard": 4, "progress": False}


@pytest.fixture(scope="session")
def bpe_docs(stdlib_corpus, bpe_tokenizer_json):
    """``(spec, eos_id, docs)``: the first NUM_DOCS corpus files as BPE ids (no EOS), uint16."""
    spec = f"hf:{bpe_tokenizer_json}"
    tok = load_tokenizer(spec)
    ids = tok.encode_batch(list(stdlib_corpus.texts[:NUM_DOCS]))
    return spec, tok.eos_id, [np.asarray(d, dtype=np.uint16) for d in ids]


def write_input(kind: str, root: Path, docs: list[np.ndarray], eos: int) -> tuple[str, dict]:
    """One input of ``kind`` holding ``docs`` (with EOS where the kind has no other boundary)."""
    ended = with_eos(docs, eos)
    if kind == "npy":
        np.save(root / "corpus.npy", np.concatenate(ended))
        return str(root / "corpus.npy"), {}
    if kind == "bin":
        np.concatenate(ended).astype("<u4").tofile(root / "corpus.bin")
        return str(root / "corpus.bin"), {"token_dtype": "uint32"}
    if kind == "bin+offsets":
        np.concatenate(docs).astype("<u2").tofile(root / "corpus.bin")
        np.save(root / "corpus.offsets.npy", np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64))
        return str(root / "corpus.bin"), {"token_dtype": "uint16", "append_eos": True}
    if kind == "megatron":
        write_megatron(root / "corpus", ended, sentences=3)
        return str(root / "corpus.idx"), {}
    if kind == "parquet":
        write_parquet(root / "corpus.parquet", docs)
        return str(root / "corpus.parquet"), {"append_eos": True}
    if kind == "jsonl.gz":
        write_jsonl(root / "corpus.jsonl.gz", ended, field="ids")
        return str(root / "corpus.jsonl.gz"), {"tokens_field": "ids"}
    assert kind == "datasets"
    pytest.importorskip("datasets", reason="the datasets extra is not installed")
    write_datasets(root / "corpus_ds", docs)
    return str(root / "corpus_ds"), {"append_eos": True}


KINDS = ["npy", "bin", "bin+offsets", "megatron", "parquet", "jsonl.gz", "datasets"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_round_trips_token_for_token_with_its_documents(kind, bpe_docs, tmp_path):
    spec, eos, docs = bpe_docs
    url, options = write_input(kind, tmp_path, docs, eos)
    summary = write_dataset(url, str(tmp_path / "out"), tokenizer=spec, input_format="tokens", **SMALL, **options)
    assert summary.records_in == summary.records_written == summary.num_documents == NUM_DOCS
    want = token_stream(docs, eos)
    with DatasetReader.open(str(tmp_path / "out")) as reader:
        assert reader.manifest.dtype == "uint16" and reader.manifest.num_shards > 2
        assert reader.read_tokens(0, reader.manifest.num_tokens).tolist() == want.tolist()
        spans = reader.documents(0, reader.manifest.num_tokens)
        assert [s.record for s in spans] == list(range(NUM_DOCS))
        assert [s.token_end - s.token_start for s in spans] == [len(d) + 1 for d in docs]
    assert (tmp_path / "out" / REJECTS_NAME).read_bytes() == b""


def test_token_input_writes_the_shards_of_the_text_path(stdlib_corpus, bpe_docs, tmp_path):
    spec, eos, docs = bpe_docs
    url, options = write_input("npy", tmp_path, docs, eos)
    write_dataset(url, str(tmp_path / "t"), tokenizer=spec, input_format="tokens", **SMALL, **options)
    write_dataset([str(f) for f in stdlib_corpus.files[:NUM_DOCS]], str(tmp_path / "x"), tokenizer=spec, **SMALL)
    from_tokens, from_text = Manifest.load(str(tmp_path / "t")), Manifest.load(str(tmp_path / "x"))
    assert from_tokens.tokenizer == from_text.tokenizer
    assert [s.sha256 for s in from_tokens.shards] == [s.sha256 for s in from_text.shards]
    assert [
        (tmp_path / "t" / s.path).read_bytes() == (tmp_path / "x" / s.path).read_bytes() for s in from_text.shards
    ] == [True] * from_text.num_shards


@pytest.mark.parametrize("kind", ["megatron", "parquet"])
def test_bytes_do_not_depend_on_workers(kind, bpe_docs, tmp_path):
    spec, eos, docs = bpe_docs
    url, options = write_input(kind, tmp_path, docs, eos)
    runs = {}
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        write_dataset(url, str(out), tokenizer=spec, input_format="tokens", workers=workers, **SMALL, **options)
        runs[workers] = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert runs[1].keys() == runs[3].keys() and len(runs[1]) > 10
    assert [name for name in runs[1] if runs[1][name] != runs[3][name]] == []


def truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def read_rejects(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / REJECTS_NAME).read_text().splitlines()]


def test_bad_ids_reject_their_document_with_source_record_and_offset(tmp_path):
    docs = [np.array([1, 2, 256]), np.array([3, -4, 5, 256]), np.array([7, 300, 256]), np.array([9, 256])]
    np.save(tmp_path / "ids.npy", np.concatenate(docs).astype(np.int32))
    out = tmp_path / "out"
    summary = write_dataset(
        str(tmp_path / "ids.npy"), str(out), tokenizer="bytes", input_format="tokens", progress=False
    )
    assert summary.records_in == 4 and summary.records_written == 2 and summary.rejected == {"bad_token": 2}
    rejects = read_rejects(out)
    assert [(r["source"], r["record"], r["reason"]) for r in rejects] == [
        (str(tmp_path / "ids.npy"), 1, "bad_token"),
        (str(tmp_path / "ids.npy"), 2, "bad_token"),
    ]
    assert rejects[0]["detail"] == "token 1 of the document (token 4 of the source): id -4 is outside [0, 257)"
    assert rejects[1]["detail"] == "token 1 of the document (token 8 of the source): id 300 is outside [0, 257)"
    with DatasetReader.open(str(out)) as reader:
        assert reader.read_tokens(0, reader.manifest.num_tokens).tolist() == [1, 2, 256, 9, 256]


def test_non_integers_nulls_and_non_lists_are_rejects_never_casts(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"input_ids": [[1.0, 2.0, 256.0], [1.5, 256.0], None, [4.0, float("nan"), 256.0]]}),
        tmp_path / "f.parquet",
    )
    lines = [
        {"input_ids": [5, 256]},
        {"input_ids": [True, 256]},
        {"input_ids": "abc"},
        {"other": 1},
        {"input_ids": [[1], 256]},
        {"input_ids": [2**70, 256]},
        {"input_ids": []},
    ]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{broken\n")
    out = tmp_path / "out"
    summary = write_dataset(
        [str(tmp_path / "f.parquet"), str(tmp_path / "g.jsonl")],
        str(out),
        tokenizer="bytes",
        input_format="tokens",
        progress=False,
    )
    reasons = [(Path(r["source"]).name, r["record"], r["reason"]) for r in read_rejects(out)]
    assert reasons == [
        ("f.parquet", 1, "bad_token"), ("f.parquet", 2, "missing_field"), ("f.parquet", 3, "bad_token"),
        ("g.jsonl", 1, "bad_token"), ("g.jsonl", 2, "not_token_list"), ("g.jsonl", 3, "missing_field"),
        ("g.jsonl", 4, "bad_token"), ("g.jsonl", 5, "bad_token"), ("g.jsonl", 6, "empty"), ("g.jsonl", 7, "bad_json"),
    ]  # fmt: skip
    details = {(Path(r["source"]).name, r["record"]): r["detail"] for r in read_rejects(out)}
    assert details[("f.parquet", 1)] == "token 0 of the document: 1.5 is not an integer"
    assert details[("g.jsonl", 1)] == "token 0 of the document: True is not an integer"
    assert summary.records_in == 12 and summary.records_written == 2
    with DatasetReader.open(str(out)) as reader:
        assert reader.read_tokens(0, reader.manifest.num_tokens).tolist() == [1, 2, 256, 5, 256]


def test_end_of_document_is_explicit(tmp_path):
    np.save(tmp_path / "noeos.npy", np.arange(10, dtype=np.uint16))
    with pytest.raises(
        InputError,
        match=r"noeos.npy: no document boundary: none of its 10 tokens is the EOS id 256 "
        r"and there is no offsets file noeos.offsets.npy",
    ):
        write_dataset(
            str(tmp_path / "noeos.npy"),
            str(tmp_path / "o1"),
            tokenizer="bytes",
            input_format="tokens",
            append_eos=True,
            progress=False,
        )
    write_parquet(tmp_path / "rows.parquet", [np.arange(3), np.arange(4)])
    with pytest.raises(
        InputError, match=r"rows.parquet records 0..1: no document ends with the EOS id 256.*--append-eos"
    ):
        write_dataset(
            str(tmp_path / "rows.parquet"),
            str(tmp_path / "o2"),
            tokenizer="bytes",
            input_format="tokens",
            progress=False,
        )
    # A tail after the last EOS has no end: rejected by name, or ended with --append-eos.
    np.save(tmp_path / "tail.npy", np.array([1, 256, 2, 3], dtype=np.uint16))
    out = tmp_path / "o3"
    summary = write_dataset(
        str(tmp_path / "tail.npy"), str(out), tokenizer="bytes", input_format="tokens", progress=False
    )
    assert summary.rejected == {"no_eos": 1}
    assert read_rejects(out)[0]["detail"] == "last id is 3, not the EOS id 256"
    summary = write_dataset(
        str(tmp_path / "tail.npy"),
        str(tmp_path / "o4"),
        tokenizer="bytes",
        input_format="tokens",
        append_eos=True,
        progress=False,
    )
    assert summary.num_documents == 2 and summary.num_tokens == 5


@pytest.mark.parametrize(
    ("make", "options", "message"),
    [
        (lambda d: np.save(d / "x.npy", np.zeros((2, 3), np.uint16)), {},
         r"x.npy: array of shape \(2, 3\), expected 1-D"),
        (lambda d: np.save(d / "x.npy", np.array(["a"])), {}, r"x.npy: dtype <U1, expected integer"),
        (lambda d: (d / "x.npy").write_bytes(b"not numpy"), {}, r"x.npy: not a readable .npy file"),
        (lambda d: (np.save(d / "x.npy", np.arange(100, dtype="<u2")), truncate(d / "x.npy", 138)), {},
         r"x.npy: header says 100 x uint16 \(200 bytes from byte 128\), the file has 138 bytes"),
        (lambda d: (d / "x.bin").write_bytes(b"\x00\x01\x02"), {"token_dtype": "uint16"},
         r"x.bin: 3 bytes is not a whole number of uint16 tokens"),
        (lambda d: (d / "x.bin").write_bytes(b"\x00\x01"), {},
         r"x.bin: a raw .bin token file needs its dtype: --token-dtype"),
        (lambda d: (np.arange(4, dtype="<u2").tofile(d / "x.bin"),
                    np.save(d / "x.offsets.npy", np.array([0, 3, 2, 4]))),
         {"token_dtype": "uint16"}, r"offsets .*x.offsets.npy entry 2: 2, expected a boundary between 3 and 4"),
        (lambda d: (np.arange(4, dtype="<u2").tofile(d / "x.bin"),
                    np.save(d / "x.offsets.npy", np.array([0, 3]))),
         {"token_dtype": "uint16"}, r"x.offsets.npy entry 1: last boundary 3, expected the token count 4"),
        (lambda d: (np.arange(4, dtype="<u2").tofile(d / "x.bin"),
                    np.save(d / "x.offsets.npy", np.array([1, 4]))),
         {"token_dtype": "uint16"}, r"x.offsets.npy entry 0: 1, expected a boundary between 0 and 4"),
        (lambda d: write_parquet(d / "x.parquet", [np.arange(3)], field="ids"), {},
         r"x.parquet: no column 'input_ids' \(columns: ids\)"),
        (lambda d: (d / "x.parquet").write_bytes(b"PAR1 broken"), {}, r"x.parquet: not a readable parquet file"),
        (lambda d: (d / "x.txt").write_text("hello"), {}, r"x.txt: not a token input"),
        (lambda d: (write_megatron(d / "x", [np.arange(5, dtype=np.uint16)]), (d / "x.bin").write_bytes(b"\x00" * 6)),
         {}, r"x.bin: documents up to 1 need 5 tokens, the file holds 3"),
        (lambda d: (write_megatron(d / "x", [np.arange(5, dtype=np.uint16)]), (d / "x.bin").write_bytes(b"\x00" * 12)),
         {}, r"x.bin: the documents end at token 5, but the file holds 6 tokens"),
    ],
)  # fmt: skip
def test_malformed_inputs_are_named_in_their_error(make, options, message, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    make(src)
    with pytest.raises(InputError, match=message):
        write_dataset(
            str(src),
            str(tmp_path / "out"),
            tokenizer="bytes",
            input_format="tokens",
            append_eos=True,
            progress=False,
            **options,
        )
    assert not (tmp_path / "out" / "manifest").exists()


def test_a_megatron_prefix_names_its_bin_and_idx(bpe_docs, tmp_path, capsys):
    """Megatron's --data-path names a dataset by its prefix; the write is the one from PREFIX.idx."""
    spec, eos, docs = bpe_docs
    write_megatron(tmp_path / "web_text_document", with_eos(docs, eos), sentences=2)
    common = ["--tokenizer", spec, "--input-format", "tokens", "--block-tokens", "4097", "--no-progress", "--json"]
    assert main(["write", str(tmp_path / "web_text_document"), "--output", str(tmp_path / "by-prefix"), *common]) == 0
    assert main(["write", str(tmp_path / "web_text_document.idx"), "--output", str(tmp_path / "by-idx"), *common]) == 0
    capsys.readouterr()
    by_prefix, by_idx = Manifest.load(str(tmp_path / "by-prefix")), Manifest.load(str(tmp_path / "by-idx"))
    assert by_prefix.num_documents == NUM_DOCS
    assert [s.path for s in by_prefix.sources] == [str(tmp_path / "web_text_document.bin")]
    assert by_prefix.fingerprint == by_idx.fingerprint
    assert [s.sha256 for s in by_prefix.shards] == [s.sha256 for s in by_idx.shards]


@pytest.mark.parametrize("present", [".bin", ".idx"])
def test_a_megatron_prefix_with_half_its_pair_is_refused_naming_the_missing_file(present, tmp_path, capsys):
    write_megatron(tmp_path / "web", [np.array([1, 2, 256], dtype=np.uint16)])
    missing = ".idx" if present == ".bin" else ".bin"
    (tmp_path / f"web{missing}").unlink()
    prefix = str(tmp_path / "web")
    with pytest.raises(InputError, match=re.escape(f"{prefix}{present} exists but {prefix}{missing} does not")):
        write_dataset(prefix, str(tmp_path / "out"), tokenizer="bytes", input_format="tokens", progress=False)
    assert main(["write", prefix, "--output", str(tmp_path / "out"), "--tokenizer", "bytes",
                 "--input-format", "tokens", "--no-progress"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert f"a Megatron dataset prefix needs {prefix}.bin and {prefix}.idx" in err
    assert not (tmp_path / "out" / "manifest").exists()


def test_a_name_that_is_neither_a_file_nor_a_prefix_says_both(tmp_path):
    prefix = str(tmp_path / "nothing")
    with pytest.raises(InputError, match=re.escape(f"{prefix}: matches no file, and no {prefix}.bin or {prefix}.idx")):
        write_dataset(prefix, str(tmp_path / "out"), tokenizer="bytes", input_format="tokens", progress=False)


def test_a_megatron_prefix_on_s3(bpe_docs, tmp_path, s3_url, s3_options):
    from zephon_stream.storage import open_store

    spec, eos, docs = bpe_docs
    write_megatron(tmp_path / "m", with_eos(docs[:20], eos), sentences=2)
    with open_store(s3_url("prefix"), s3_options) as store:
        for name in ("m.bin", "m.idx"):
            store.write_atomic(name, (tmp_path / name).read_bytes())
    summary = write_dataset(
        s3_url("prefix/m"),
        str(tmp_path / "out"),
        tokenizer=spec,
        input_format="tokens",
        storage_options=s3_options,
        **SMALL,
    )
    assert summary.num_documents == 20
    assert [s.path for s in Manifest.load(str(tmp_path / "out")).sources] == [s3_url("prefix/m.bin")]


def test_parquet_column_of_strings_and_token_options_on_text_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": ["a b c"]}), tmp_path / "s.parquet")
    with pytest.raises(InputError, match=r"column 'input_ids' is string, expected a list of integer token ids"):
        write_dataset(str(tmp_path / "s.parquet"), str(tmp_path / "o"), tokenizer="bytes", input_format="tokens")
    with pytest.raises(ConfigError, match="apply to token inputs only"):
        write_dataset(str(tmp_path / "s.parquet"), str(tmp_path / "o"), tokenizer="bytes", append_eos=True)
    with pytest.raises(ConfigError, match="no BOS is added"):
        write_dataset(
            str(tmp_path / "s.parquet"), str(tmp_path / "o"), tokenizer="bytes", input_format="tokens", bos_token="x"
        )


def test_cli_writes_tokens_and_three_ranks_merge_to_the_same_tokens(bpe_docs, tmp_path, monkeypatch, capsys):
    spec, eos, docs = bpe_docs
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        write_megatron(src / f"part{i}", with_eos(docs[i * 30 : (i + 1) * 30], eos), sentences=2)
    common = ["--tokenizer", spec, "--input-format", "tokens", "--block-tokens", "4097", "--no-progress", "--json"]
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"):
        monkeypatch.delenv(var, raising=False)
    assert main(["write", str(src), "--output", str(tmp_path / "one"), *common]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["num_documents"] == 120 and summary["records_in"] == 120
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert main(["write", str(src), "--output", str(tmp_path / "merged"), *common]) == 0
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert main(["merge", "--output", str(tmp_path / "merged")]) == 0
    capsys.readouterr()
    parts = [Manifest.load(str(p)) for p in sorted((tmp_path / "merged").glob("part-*"))]
    assert [[Path(s.path).name for s in m.sources] for m in parts] == [
        ["part0.bin", "part1.bin"],
        ["part2.bin"],
        ["part3.bin"],
    ]
    with DatasetReader.open(str(tmp_path / "one")) as one, DatasetReader.open(str(tmp_path / "merged")) as merged:
        assert merged.manifest.num_documents == one.manifest.num_documents == 120
        want = one.read_tokens(0, one.manifest.num_tokens)
        got = np.concatenate([merged.read_block(b) for b in range(merged.manifest.num_blocks)])
        assert got.tolist() == want.tolist() == token_stream(docs, eos).tolist()


def test_s3_token_inputs_and_output_match_a_local_run(bpe_docs, tmp_path, s3_url, s3_options):
    from zephon_stream.storage import open_store

    spec, eos, docs = bpe_docs
    write_megatron(tmp_path / "m", with_eos(docs, eos), sentences=2)
    write_input("npy", tmp_path, docs, eos)
    with open_store(s3_url("raw"), s3_options) as store:
        for name in ("m.bin", "m.idx", "corpus.npy"):
            store.write_atomic(name, (tmp_path / name).read_bytes())
    remote = write_dataset(
        s3_url("raw/*"), s3_url("ds"), tokenizer=spec, input_format="tokens", storage_options=s3_options, **SMALL
    )
    local = write_dataset(
        [str(tmp_path / "corpus.npy"), str(tmp_path / "m.bin")],
        str(tmp_path / "local"),
        tokenizer=spec,
        input_format="tokens",
        **SMALL,
    )
    assert remote.num_documents == local.num_documents == 2 * NUM_DOCS
    assert remote.fingerprint == local.fingerprint
    remote_m = Manifest.load(s3_url("ds"), s3_options)
    assert [s.path.rsplit("/", 1)[-1] for s in remote_m.sources] == ["corpus.npy", "m.bin"]
    assert [s.sha256 for s in remote_m.shards] == [s.sha256 for s in Manifest.load(str(tmp_path / "local")).shards]


@pytest.mark.slow
def test_killed_token_writer_reruns_to_the_same_bytes(bpe_docs, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    spec, eos, docs = bpe_docs
    np.save(tmp_path / "big.npy", np.tile(token_stream(docs, eos).astype(np.uint16), 8))

    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "zephon_stream", "write", str(tmp_path / "big.npy"), "--output", str(out),
                "--tokenizer", spec, "--input-format", "tokens", "--block-tokens", "4097", "--blocks-per-shard", "2",
                "--no-progress"]  # fmt: skip

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (killed / "shards" / "00000003.zst").exists():
        assert proc.poll() is None, f"writer ended before its fourth shard: {proc.stderr.read().decode()}"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (killed / "manifest").exists(), "the killed run finished before the kill; the test proved nothing"
    for out in (killed, tmp_path / "clean"):
        done = subprocess.run(command(out), env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    files = {
        out: {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        for out in (killed, tmp_path / "clean")
    }
    assert files[killed].keys() == files[tmp_path / "clean"].keys() and len(files[killed]) > 100
    assert [p for p in files[killed] if files[killed][p] != files[tmp_path / "clean"][p]] == []


def test_progress_bar_and_summary_count_token_input_bytes_and_tokens(bpe_docs, tmp_path, capsys):
    spec, eos, docs = bpe_docs
    url, options = write_input("megatron", tmp_path, docs, eos)
    summary = write_dataset(
        url, str(tmp_path / "out"), tokenizer=spec, input_format="tokens", block_tokens=4097, progress=True, **options
    )
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    size = (tmp_path / "corpus.bin").stat().st_size
    assert final.startswith("write: 100%") and f"{summary.num_tokens:,} tokens" in final, final
    assert summary.input_bytes == size and summary.num_tokens == size // 2
    table = summary.table()
    assert f"tokens            {summary.num_tokens:,}" in table and "records rejected  0" in table


@pytest.mark.parametrize("row_tokens", [3, 2000])
def test_append_eos_ends_only_the_documents_without_one_short_or_long(row_tokens, tmp_path):
    rng = np.random.default_rng(row_tokens)
    docs = [rng.integers(0, 256, rng.integers(1, 2 * row_tokens)).astype(np.uint16) for _ in range(300)]
    for doc in docs[::4]:
        doc[-1] = 256
    write_parquet(tmp_path / "rows.parquet", docs)
    summary = write_dataset(
        str(tmp_path / "rows.parquet"),
        str(tmp_path / "out"),
        tokenizer="bytes",
        input_format="tokens",
        append_eos=True,
        progress=False,
    )
    want = np.concatenate([d if d[-1] == 256 else np.append(d, 256) for d in docs])
    assert summary.num_documents == 300 and summary.num_tokens == len(want)
    with DatasetReader.open(str(tmp_path / "out")) as reader:
        assert reader.read_tokens(0, len(want)).tolist() == want.tolist()


@pytest.mark.parametrize("eos_rows", [0, 1])
def test_packed_rows_of_one_length_get_eos_like_any_document(eos_rows, tmp_path):
    # Rows of one length, none ending with EOS, take one strided copy; one
    # row already ending with EOS sends the batch down the per-document path.
    rows = np.random.default_rng(eos_rows).integers(0, 256, (700, 2049)).astype(np.uint16)
    rows[3, -1] = 256 if eos_rows else 7
    np.save(tmp_path / "rows.npy", rows.reshape(-1))
    np.save(tmp_path / "rows.offsets.npy", np.arange(701, dtype=np.int64) * 2049)
    summary = write_dataset(
        str(tmp_path / "rows.npy"),
        str(tmp_path / "out"),
        tokenizer="bytes",
        input_format="tokens",
        append_eos=True,
        block_tokens=65537,
        progress=False,
    )
    want = np.concatenate([row if row[-1] == 256 else np.append(row, 256) for row in rows])
    assert summary.num_documents == 700 and summary.num_tokens == len(want) == 700 * 2050 - eos_rows
    with DatasetReader.open(str(tmp_path / "out")) as reader:
        assert np.array_equal(reader.read_tokens(0, len(want)), want)
        last = reader.documents(len(want) - 1, len(want))[0]
        assert (last.record, last.token_start, last.token_end) == (699, len(want) - 2050, len(want))
