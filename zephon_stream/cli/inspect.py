"""``zephon-stream inspect``: what a dataset holds, from its manifest alone; with
``--packing-report``, also how each packing cuts its documents (reads blocks)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    from zephon_stream.cli import bounded_int

    parser = subparsers.add_parser(
        "inspect",
        help="show a dataset's shards, blocks, tokens, documents, bytes and tokenizer",
        description=(
            "Read a dataset's manifest (validated) and print its figures. Reads no shard, unless "
            "--packing-report: then it also reads blocks and compares how the loader's two packings "
            "(concat: windows; best_fit: rows of whole documents) cut the documents at each --seq-len."
        ),
    )
    parser.add_argument("url", metavar="URL", help="dataset root: local folder or store prefix (s3://, gs://, az://)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--shards", action="store_true", help="also list every shard (path, tokens, blocks, bytes)")
    parser.add_argument(
        "--packing-report",
        action="store_true",
        help="also read blocks and compare concat and best_fit: documents cut, tokens read without their "
        "document's beginning, and the floor (documents longer than a row); needs --seq-len",
    )
    parser.add_argument(
        "--seq-len",
        type=bounded_int(1),
        action="append",
        metavar="L",
        help="row length of the packing report (repeatable: each block is read once)",
    )
    parser.add_argument(
        "--blocks",
        type=bounded_int(1),
        metavar="N",
        help="blocks the packing report reads, spread evenly over the dataset (default: all)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar for the packing report")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option (s3fs, gcsfs, adlfs; repeatable)",
    )
    parser.set_defaults(handler=run)


def _size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if num_bytes < 1024 or unit == "TiB":
            return f"{num_bytes:,.0f} {unit}" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def _last_block_tokens(manifest: Any) -> int | None:
    return manifest.block_num_tokens(manifest.num_blocks - 1) if manifest.num_blocks else None


def _last_shard_blocks(manifest: Any) -> int | None:
    return manifest.shards[-1].num_blocks if manifest.shards else None


def _last_differs(full: int, last: int | None, what: str) -> str:
    """``full``, and what the last one holds when it is short (only the last may be)."""
    if last is None or last == full:
        return f"{full:,}"
    return f"{full:,} (the last {what} holds {last:,})"


def _tokenizer_rows(tok: Any) -> list[tuple[str, str]]:
    """The tokenizer as ``--tokenizer`` names it (``bytes``, ``hf:PATH``), then its ids."""
    # The bytes tokenizer's kind and name are both "bytes"; say it once.
    spec = tok.kind if tok.name in ("", tok.kind) else f"{tok.kind}:{tok.name}"
    bos = "no BOS" if tok.bos_id is None else f"BOS id {tok.bos_id}"
    return [
        ("tokenizer", spec),
        ("vocabulary", f"{tok.vocab_size:,} ids (EOS id {tok.eos_id}, {bos})"),
        ("tokenizer fp", tok.fingerprint),
    ]


def _check_report_args(args: argparse.Namespace) -> None:
    from zephon_stream.errors import ConfigError

    if args.packing_report and not args.seq_len:
        raise ConfigError("--packing-report needs --seq-len L (repeatable), the row length to compare the packings at")
    if not args.packing_report and (args.seq_len or args.blocks is not None):
        raise ConfigError("--seq-len and --blocks belong to --packing-report")


def _packing_report(manifest: Any, store: Any, args: argparse.Namespace) -> Any:
    import sys

    from tqdm import tqdm

    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.packing_report import packing_report, spread_blocks

    total = len(spread_blocks(manifest.num_blocks, args.blocks))
    with tqdm(
        total=total,
        unit="block",
        desc="packing report",
        file=sys.stderr,
        disable=args.no_progress or not sys.stderr.isatty(),
    ) as bar:
        return packing_report(DatasetReader(manifest, store), args.seq_len, blocks=args.blocks, progress=bar.update)


def run(args: argparse.Namespace) -> int:
    from zephon_stream.format.manifest import Manifest
    from zephon_stream.storage import open_store, parse_storage_options
    from zephon_stream.writer.progress import name_value_table

    _check_report_args(args)
    with open_store(args.url, parse_storage_options(args.storage_option)) as store:
        manifest = Manifest.read(store)
        url = store.url
        report = _packing_report(manifest, store, args) if args.packing_report else None
    summary = {"url": url, **manifest.summary()}
    if args.shards:
        summary["shards"] = [
            {
                "path": s.path,
                "num_tokens": s.num_tokens,
                "num_blocks": s.num_blocks,
                "num_bytes": s.num_bytes,
                "num_documents": s.num_documents,
                "sha256": s.sha256,
            }
            for s in manifest.shards
        ]
    if report is not None:
        summary["packing_report"] = report.to_dict()
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    ratio = summary["compression_ratio"]
    per_token = summary["bytes_per_token"]
    rows = [
        ("dataset", url),
        ("format", f"{summary['format']} {summary['version']}"),
        ("tokens", f"{manifest.num_tokens:,} ({manifest.dtype})"),
        ("documents", f"{manifest.num_documents:,} from {len(manifest.sources):,} sources"),
        ("rejected", f"{manifest.num_rejected:,} (listed in {manifest.rejects_path})"),
        ("blocks", f"{manifest.num_blocks:,}"),
        ("tokens per block", _last_differs(manifest.block_tokens, _last_block_tokens(manifest), "block")),
        ("shards", f"{manifest.num_shards:,}"),
        ("blocks per shard", _last_differs(manifest.blocks_per_shard, _last_shard_blocks(manifest), "shard")),
        ("compressed", f"{_size(manifest.compressed_bytes)} ({manifest.compressed_bytes:,} bytes)"),
        ("compression", "-" if ratio is None else f"{ratio:.2f}x ({per_token:.3f} bytes/token)"),
        *_tokenizer_rows(manifest.tokenizer),
        ("fingerprint", manifest.fingerprint),
    ]
    print(name_value_table(rows))
    if args.shards:
        print()
        print(f"{'shard':<40} {'tokens':>14} {'blocks':>7} {'bytes':>14} {'docs':>10}")
        for s in summary["shards"]:
            print(
                f"{s['path']:<40} {s['num_tokens']:>14,} {s['num_blocks']:>7} {s['num_bytes']:>14,} "
                f"{s['num_documents']:>10,}"
            )
    if report is not None:
        print()
        print(report.text())
    return 0
