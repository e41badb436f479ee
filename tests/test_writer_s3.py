"""The writer against S3: inputs, tokenizer file and output on a moto server
on loopback, reached over real HTTP through s3fs."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from zephon_stream import Manifest, write_dataset
from zephon_stream.reader import DatasetReader
from zephon_stream.storage import open_store


def upload(url: str, options, files: dict[str, bytes]) -> None:
    with open_store(url, options) as store:
        for name, data in files.items():
            store.write_atomic(name, data)


def test_s3_inputs_and_output_match_a_local_run(stdlib_corpus, bpe_tokenizer_json, s3_url, s3_options, tmp_path):
    texts = stdlib_corpus.texts[:30]
    jsonl = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    upload(
        s3_url("raw"),
        s3_options,
        {
            "a/part-0.jsonl.gz": gzip.compress(jsonl, mtime=0),
            "tok/tokenizer.json": bpe_tokenizer_json.read_bytes(),
        },
    )
    local_jsonl = tmp_path / "part-0.jsonl.gz"
    local_jsonl.write_bytes(gzip.compress(jsonl, mtime=0))
    spec_s3 = f"hf:{s3_url('raw/tok/tokenizer.json')}"
    summary = write_dataset(
        s3_url("raw/a/*.jsonl.gz"),
        s3_url("ds"),
        tokenizer=spec_s3,
        block_tokens=4097,
        blocks_per_shard=4,
        workers=2,
        storage_options=s3_options,
        progress=False,
    )
    write_dataset(
        str(local_jsonl),
        str(tmp_path / "local"),
        tokenizer=f"hf:{bpe_tokenizer_json}",
        block_tokens=4097,
        blocks_per_shard=4,
        progress=False,
    )
    assert summary.num_documents == len(texts) and summary.num_shards > 2
    # Object sizes are not known up front, so the worker processes start.
    assert summary.tokenizer_processes == 2
    remote_m = Manifest.load(s3_url("ds"), s3_options)
    local_m = Manifest.load(str(tmp_path / "local"))
    # Same token stream and tokenizer bytes: same shards, same fingerprint.
    assert remote_m.fingerprint == local_m.fingerprint
    assert [s.sha256 for s in remote_m.shards] == [s.sha256 for s in local_m.shards]
    assert remote_m.sources[0].path == s3_url("raw/a/part-0.jsonl.gz")
    with DatasetReader.open(s3_url("ds"), s3_options) as reader:
        tok = reader.tokenizer(storage_options=s3_options)
        spans = reader.documents(0, reader.manifest.num_tokens)
        assert [s.record for s in spans] == list(range(len(texts)))
        assert tok.decode(reader.document_tokens(spans[3])[:-1]) == texts[3]
    with open_store(s3_url("ds"), s3_options) as store:
        names = store.list()
    assert "manifest" in names and "rejects.jsonl" in names
    assert sum(n.endswith(".zst") for n in names) == remote_m.num_shards


@pytest.mark.slow
def test_cli_reads_credentials_and_endpoint_from_aws_variables(stdlib_corpus, s3_bucket, s3_url, tmp_path):
    upload(s3_url("src"), s3_bucket.storage_options, {p.name: p.read_bytes() for p in stdlib_corpus.files[:12]})
    launcher_vars = ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")
    env = {**{k: v for k, v in os.environ.items() if k not in launcher_vars}, **s3_bucket.env}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zephon_stream",
            "write",
            s3_url("src/*.py"),
            "--output",
            s3_url("out"),
            "--tokenizer",
            "bytes",
            "--block-tokens",
            "4097",
            "--no-progress",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["num_documents"] == 12
    assert summary["num_tokens"] == sum(len(t.encode()) + 1 for t in stdlib_corpus.texts[:12])
    assert "testing-secret" not in proc.stdout + proc.stderr
    manifest = Manifest.load(s3_url("out"), s3_bucket.storage_options)
    assert manifest.num_tokens == summary["num_tokens"]
