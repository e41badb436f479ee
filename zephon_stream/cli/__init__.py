"""The ``zephon-stream`` command: thin argument parsing over the public API.

Each subcommand lives in its own module here and exposes
``register(subparsers)``; the module's handler parses nothing itself beyond
its arguments and calls the library.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from zephon_stream.errors import ZephonError

# NOTE: modules are imported lazily so `zephon-stream inspect` does not pay for
# torch or tokenizers; a missing module means that subcommand is not built yet.
_SUBCOMMAND_MODULES = (
    "write",
    "inspect",
    "verify",
    "which",
    "merge",
    "reindex",
    "difflog",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zephon-stream",
        description="Token shards for LLM pretraining: write, inspect, verify, stream.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"zephon_stream.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"zephon_stream.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except ZephonError as exc:
        print(f"zephon-stream {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"zephon-stream {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
