"""``zephon-stream merge``: join parts written by separate ranks into one dataset."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "merge",
        help="join parts written by separate ranks into one dataset (shards are not copied)",
        description=(
            "Write one manifest at --output listing the shards of every PART, in the order "
            "given. Parts must lie below --output (as `write` under torchrun or Slurm leaves "
            "them: OUTPUT/part-00000-of-00003/). With no PART, every part-*-of-* folder under "
            "--output is merged in rank order, and a missing rank is an error."
        ),
    )
    parser.add_argument("parts", nargs="*", metavar="PART", help="part folder or URL (or a path relative to --output)")
    parser.add_argument(
        "--output", required=True, help="merged dataset root: local folder or store prefix (s3://, gs://, az://)"
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for the output store (s3fs, gcsfs, adlfs; repeatable)",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="commit the merge even if no part holds a token (without it: exit 1, no manifest written)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from zephon_stream.storage import parse_storage_options
    from zephon_stream.writer.merge import merge_parts
    from zephon_stream.writer.progress import name_value_table

    manifest = merge_parts(
        args.parts,
        args.output,
        storage_options=parse_storage_options(args.storage_option),
        allow_empty=args.allow_empty,
    )
    parts = sorted({shard.path.split("/", 1)[0] for shard in manifest.shards})
    print(f"merged {len(parts)} parts into {args.output}")
    rows = [
        ("shards", f"{manifest.num_shards:,}"),
        ("blocks", f"{manifest.num_blocks:,}"),
        ("tokens", f"{manifest.num_tokens:,}"),
        ("documents", f"{manifest.num_documents:,}"),
        ("rejected", f"{manifest.num_rejected:,}"),
        ("sources", f"{len(manifest.sources):,}"),
        ("compressed bytes", f"{manifest.compressed_bytes:,}"),
        ("fingerprint", manifest.fingerprint),
    ]
    print(name_value_table(rows, indent="  "))
    return 0
