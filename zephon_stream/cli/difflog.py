"""``zephon-stream diff-log A B``: the first step where two runs' data diverged."""

from __future__ import annotations

import argparse
from typing import Any

from zephon_stream.loader import first_divergence, read_audit_log
from zephon_stream.storage import parse_storage_options


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diff-log",
        help="compare two audit logs and name the first step where their data diverged",
        description=(
            "Compare the audit logs of two runs (StreamingLoader(audit_log=...)) over the steps both hold. "
            "Exit 0 if they agree on every common step, 1 at the first divergence. Steps count from 0, "
            "as `zephon-stream which --step` counts them."
        ),
    )
    parser.add_argument("log_a", help="first audit log (path or URL)")
    parser.add_argument("log_b", help="second audit log (path or URL)")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec storage option for remote logs (repeatable)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    options = parse_storage_options(args.storage_option) or None
    records_a = read_audit_log(args.log_a, options)
    records_b = read_audit_log(args.log_b, options)
    divergence, compared = first_divergence(records_a, records_b)
    if divergence is None:
        print(f"identical over {compared} common steps")
        return 0
    print(
        f"diverged at step {divergence.step}: {divergence.field} differs "
        f"({divergence.value_a!r} in {args.log_a}, {divergence.value_b!r} in {args.log_b}); "
        f"{compared - 1} earlier common steps agree"
    )
    return 1
