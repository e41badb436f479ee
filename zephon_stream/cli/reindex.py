"""``zephon-stream reindex``: give a format 1.0 dataset the index objects of 1.1, in place."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "reindex",
        help="add format 1.1's index objects to a 1.0 dataset, in place (no shard rewritten)",
        description=(
            "Write the index objects of format 1.1 beside DATASET's manifest, then replace the "
            "manifest with the 1.1 header that names them, atomically. No shard, sidecar or rejects "
            "list is rewritten and the fingerprint stays the same, so a job checkpointed on the 1.0 "
            "dataset resumes on it. Loaders then read only the metadata their steps need. "
            "A dataset already in 1.1 is left as it is."
        ),
    )
    parser.add_argument(
        "url", metavar="DATASET", help="dataset root: local folder or store prefix (s3://, gs://, az://)"
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for the store (repeatable)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from zephon_stream.storage import parse_storage_options
    from zephon_stream.writer.progress import name_value_table
    from zephon_stream.writer.reindex import reindex

    result = reindex(args.url, storage_options=parse_storage_options(args.storage_option))
    version = "{}.{}".format(*result.manifest.version)
    if not result.written:
        print(f"{result.url}: already format {version}; nothing written")
        return 0
    header = result.written["manifest"]
    rows = [
        ("format", "{}.{} -> {}".format(*result.before, version)),
        *((path, f"{size:,} bytes") for path, size in result.written.items() if path != "manifest"),
        ("manifest", f"{header:,} bytes"),
        ("fingerprint", f"{result.manifest.fingerprint} (unchanged)"),
    ]
    print(f"reindexed {result.url}")
    print(name_value_table(rows, indent="  "))
    return 0
