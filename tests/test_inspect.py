"""``zephon-stream inspect``: the figures of a dataset, as a table or one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

from test_format_dataset import byte_docs, make_dataset
from zephon_stream.cli import main


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


def _lines(out: str) -> dict[str, str]:
    """The table's rows as {name: value} (names are padded to one width)."""
    rows = {}
    for line in out.strip().splitlines():
        name, _, value = line.partition("  ")
        rows[name.strip()] = value.strip()
    return rows


def test_inspect_table_reads_as_plain_lines(tmp_path: Path, capsys) -> None:
    """Counts and sizes on lines of their own; the tokenizer named once, as --tokenizer takes it."""
    manifest = make_dataset(tmp_path, byte_docs(8), block_tokens=1000, blocks_per_shard=2)
    assert main(["inspect", str(tmp_path)]) == 0
    rows = _lines(capsys.readouterr().out)
    last_block = manifest.block_num_tokens(manifest.num_blocks - 1)
    last_shard = manifest.shards[-1].num_blocks
    assert last_block != 1000  # the fixture's token count is not a multiple of the block size
    assert rows["blocks"] == f"{manifest.num_blocks:,}"
    assert rows["tokens per block"] == f"1,000 (the last block holds {last_block:,})"
    assert rows["shards"] == f"{manifest.num_shards:,}"
    assert rows["blocks per shard"] == ("2" if last_shard == 2 else f"2 (the last shard holds {last_shard})")
    assert rows["tokenizer"] == "bytes"
    assert rows["vocabulary"] == "257 ids (EOS id 256, no BOS)"
    assert rows["tokens"] == f"{manifest.num_tokens:,} (uint16)"


def test_inspect_names_a_bpe_tokenizer_by_kind_and_name(small_bpe_dataset, capsys) -> None:
    tok = small_bpe_dataset.manifest.tokenizer
    assert main(["inspect", small_bpe_dataset.url]) == 0
    rows = _lines(capsys.readouterr().out)
    assert rows["tokenizer"] == f"{tok.kind}:{tok.name}" and tok.kind == "hf"
    assert rows["vocabulary"].startswith(f"{tok.vocab_size:,} ids (EOS id {tok.eos_id}, ")


def test_inspect_json_keys_stay_stable(tmp_path: Path, capsys) -> None:
    """Scripts read --json: its keys are a contract, only ever added to."""
    make_dataset(tmp_path, byte_docs(4))
    assert main(["inspect", str(tmp_path), "--json", "--shards"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary) == {
        "url",
        "format",
        "version",
        "num_shards",
        "num_blocks",
        "num_tokens",
        "num_documents",
        "num_rejected",
        "num_sources",
        "compressed_bytes",
        "raw_bytes",
        "compression_ratio",
        "bytes_per_token",
        "dtype",
        "block_tokens",
        "blocks_per_shard",
        "fingerprint",
        "tokenizer",
        "shards",
    }
    assert set(summary["tokenizer"]) == {"kind", "name", "vocab_size", "eos_id", "bos_id", "fingerprint"}
    assert set(summary["shards"][0]) == {"path", "num_tokens", "num_blocks", "num_bytes", "num_documents", "sha256"}


def test_inspect_refuses_an_escaping_manifest(tmp_path: Path, capsys) -> None:
    import msgpack

    make_dataset(tmp_path, byte_docs(3), version=(1, 0))
    obj = msgpack.unpackb((tmp_path / "manifest").read_bytes())
    obj["shards"][0]["path"] = "../x"
    (tmp_path / "manifest").write_bytes(msgpack.packb(obj))
    assert main(["inspect", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "'../x'" in err and "manifest" in err


def test_inspect_over_s3_with_storage_options_never_prints_the_secret(
    tmp_path: Path, s3_bucket, s3_url, capsys
) -> None:
    from zephon_stream.storage import open_store

    manifest = make_dataset(tmp_path, byte_docs(4))
    url = s3_url("inspect-me")
    opts = s3_bucket.storage_options
    store = open_store(url, opts)
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        store.write_atomic(path.relative_to(tmp_path).as_posix(), path.read_bytes())
    args = [
        "inspect",
        url,
        "--json",
        "--storage-option",
        f"key={opts['key']}",
        "--storage-option",
        f"secret={opts['secret']}",
        "--storage-option",
        f"endpoint_url={opts['endpoint_url']}",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["fingerprint"] == manifest.fingerprint and summary["num_tokens"] == manifest.num_tokens
    assert opts["secret"] not in captured.out + captured.err
    # A missing dataset under the same options: the error names the URL, not the secret.
    assert (
        main(
            [
                "inspect",
                s3_url("nothing-here"),
                "--storage-option",
                f"secret={opts['secret']}",
                "--storage-option",
                f"key={opts['key']}",
                "--storage-option",
                f"endpoint_url={opts['endpoint_url']}",
            ]
        )
        == 1
    )
    captured = capsys.readouterr()
    assert "no committed dataset" in captured.err and opts["secret"] not in captured.err
