"""``zephon-stream inspect``: what a dataset holds, from its manifest alone."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show a dataset's shards, blocks, tokens, documents, bytes and tokenizer",
        description="Read a dataset's manifest (validated) and print its figures. Reads no shard.",
    )
    parser.add_argument("url", metavar="URL", help="dataset root: local folder or s3://bucket/prefix")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--shards", action="store_true", help="also list every shard (path, tokens, blocks, bytes)")
    parser.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="fsspec/s3fs option (repeatable)",
    )
    parser.set_defaults(handler=run)


def _size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if num_bytes < 1024 or unit == "TiB":
            return f"{num_bytes:,.0f} {unit}" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def run(args: argparse.Namespace) -> int:
    from zephon_stream.format.manifest import Manifest
    from zephon_stream.storage import open_store, parse_storage_options
    from zephon_stream.writer.progress import name_value_table

    with open_store(args.url, parse_storage_options(args.storage_option)) as store:
        manifest = Manifest.read(store)
        url = store.url
    summary = {"url": url, **manifest.summary()}
    if args.shards:
        summary["shards"] = [
            {"path": s.path, "num_tokens": s.num_tokens, "num_blocks": s.num_blocks,
             "num_bytes": s.num_bytes, "num_documents": s.num_documents, "sha256": s.sha256}
            for s in manifest.shards
        ]
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    tok = manifest.tokenizer
    ratio = summary["compression_ratio"]
    per_token = summary["bytes_per_token"]
    rows = [
        ("dataset", url),
        ("format", f"{summary['format']} {summary['version']}"),
        ("shards", f"{manifest.num_shards:,}"),
        ("blocks", f"{manifest.num_blocks:,} of {manifest.block_tokens:,} tokens, {manifest.blocks_per_shard} per shard"),
        ("tokens", f"{manifest.num_tokens:,} ({manifest.dtype})"),
        ("documents", f"{manifest.num_documents:,} from {len(manifest.sources):,} sources"),
        ("rejected", f"{manifest.num_rejected:,} (listed in {manifest.rejects_path})"),
        ("compressed", f"{_size(manifest.compressed_bytes)} ({manifest.compressed_bytes:,} bytes)"),
        ("compression", "-" if ratio is None else f"{ratio:.2f}x ({per_token:.3f} bytes/token)"),
        ("tokenizer", f"{tok.kind} {tok.name} (vocab {tok.vocab_size:,}, eos {tok.eos_id}, bos {tok.bos_id})"),
        ("tokenizer fp", tok.fingerprint),
        ("fingerprint", manifest.fingerprint),
    ]
    print(name_value_table(rows))
    if args.shards:
        print()
        print(f"{'shard':<40} {'tokens':>14} {'blocks':>7} {'bytes':>14} {'docs':>10}")
        for s in summary["shards"]:
            print(f"{s['path']:<40} {s['num_tokens']:>14,} {s['num_blocks']:>7} {s['num_bytes']:>14,} {s['num_documents']:>10,}")
    return 0
