"""``zephon-stream inspect``: the figures of a dataset, as a table or one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

from zephon_stream.cli import main
from test_format_dataset import byte_docs, make_dataset


def test_inspect_json_has_the_documented_fields(tmp_path: Path, capsys) -> None:
    rejects = [{"source": "x.txt", "record": 0, "reason": "empty", "detail": ""}]
    manifest = make_dataset(tmp_path, byte_docs(8), block_tokens=1000, blocks_per_shard=2, rejects=rejects)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    summary = json.loads(out)
    assert summary["num_shards"] == manifest.num_shards == len(list((tmp_path / "shards").glob("*.zst")))
    assert summary["num_blocks"] == manifest.num_blocks
    assert summary["num_tokens"] == sum(len(t) for _, t in byte_docs(8))
    assert summary["num_documents"] == 8
    assert summary["num_rejected"] == 1
    assert summary["compressed_bytes"] == sum(p.stat().st_size for p in (tmp_path / "shards").glob("*.zst"))
    assert summary["dtype"] == "uint16"
    assert summary["block_tokens"] == 1000
    assert summary["fingerprint"] == manifest.fingerprint
    assert summary["tokenizer"]["kind"] == "bytes" and summary["tokenizer"]["eos_id"] == 256
    assert summary["compression_ratio"] == summary["num_tokens"] * 2 / summary["compressed_bytes"]
    assert summary["compression_ratio"] > 1.5  # real source text compresses


def test_inspect_table_and_shard_listing(tmp_path: Path, capsys) -> None:
    manifest = make_dataset(tmp_path, byte_docs(8), block_tokens=1000, blocks_per_shard=2)
    assert main(["inspect", str(tmp_path), "--shards"]) == 0
    out = capsys.readouterr().out
    assert f"{manifest.num_tokens:,} (uint16)" in out
    assert manifest.fingerprint in out
    for shard in manifest.shards:
        assert shard.path in out


def test_inspect_refuses_an_escaping_manifest(tmp_path: Path, capsys) -> None:
    import msgpack

    make_dataset(tmp_path, byte_docs(3))
    obj = msgpack.unpackb((tmp_path / "manifest").read_bytes())
    obj["shards"][0]["path"] = "../x"
    (tmp_path / "manifest").write_bytes(msgpack.packb(obj))
    assert main(["inspect", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "'../x'" in err and "manifest" in err


def test_inspect_over_s3_with_storage_options_never_prints_the_secret(tmp_path: Path, s3_bucket, s3_url, capsys) -> None:
    from zephon_stream.storage import open_store

    manifest = make_dataset(tmp_path, byte_docs(4))
    url = s3_url("inspect-me")
    opts = s3_bucket.storage_options
    store = open_store(url, opts)
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        store.write_atomic(path.relative_to(tmp_path).as_posix(), path.read_bytes())
    args = ["inspect", url, "--json", "--storage-option", f"key={opts['key']}", "--storage-option", f"secret={opts['secret']}",
            "--storage-option", f"endpoint_url={opts['endpoint_url']}"]
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["fingerprint"] == manifest.fingerprint and summary["num_tokens"] == manifest.num_tokens
    assert opts["secret"] not in captured.out + captured.err
    # A missing dataset under the same options: the error names the URL, not the secret.
    assert main(["inspect", s3_url("nothing-here"), "--storage-option", f"secret={opts['secret']}",
                 "--storage-option", f"key={opts['key']}", "--storage-option", f"endpoint_url={opts['endpoint_url']}"]) == 1
    captured = capsys.readouterr()
    assert "no committed dataset" in captured.err and opts["secret"] not in captured.err
