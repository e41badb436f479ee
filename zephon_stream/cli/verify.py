"""``zephon-stream verify``: re-hash every shard and decode every block."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    from zephon_stream.cli import bounded_int

    parser = subparsers.add_parser(
        "verify",
        help="re-hash every shard, decode every block, check sidecars; exit 1 on any problem",
        description=(
            "Check a dataset end to end: every shard's sha256 and size against the manifest, every "
            "block's zstd frame and checksum, every document index, and the rejects list. Every "
            "problem is listed (object, block, byte offsets); the exit status is 1 if any was found."
        ),
    )
    parser.add_argument("url", metavar="URL", help="dataset root: local folder or store prefix (s3://, gs://, az://)")
    parser.add_argument("--workers", type=bounded_int(1), default=4, help="shards checked concurrently (default 4)")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option (s3fs, gcsfs, adlfs; repeatable)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.verify import verify_dataset
    from zephon_stream.storage import parse_storage_options

    with DatasetReader.open(args.url, parse_storage_options(args.storage_option)) as reader:
        m = reader.manifest
        with tqdm(
            total=m.compressed_bytes,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc="verify",
            disable=not sys.stderr.isatty(),
            file=sys.stderr,
        ) as bar:
            report = verify_dataset(reader, workers=args.workers, progress=bar.update)
    for problem in report.problems:
        print(problem)
    status = "OK" if report.ok else f"FAILED: {len(report.problems)} problem(s)"
    print(
        f"verify {report.url}: {status}; {report.num_blocks_checked:,} of {m.num_blocks:,} blocks decoded, "
        f"{m.num_shards:,} shards, {report.bytes_checked:,} bytes read"
    )
    return 0 if report.ok else 1
