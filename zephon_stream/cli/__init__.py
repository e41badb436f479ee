"""The ``zephon-stream`` command: thin argument parsing over the public API.

Each subcommand lives in its own module here and exposes
``register(subparsers)``; the module's handler parses nothing itself beyond
its arguments and calls the library.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from zephon_stream.errors import ZephonError

# Modules are imported lazily so `zephon-stream inspect` does not pay for
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


# plan.packing.PACKINGS, spelled out so that building the parser
# imports no plan module (tests/test_which.py keeps the two equal).
PACKING_CHOICES = ("concat", "best_fit")


# argparse's own status for a usage error (an unknown option, a missing
# argument), kept for no command at all too, as other command-line tools do.
EXIT_USAGE = 2

EXIT_STATUS_EPILOG = (
    "exit status: 0 done; 1 an error the command reports on stderr, or a check that failed (verify, diff-log, "
    "demo); 2 a usage error; 130 interrupted; 141 stdout's reader went away (| head)"
)


def bounded_int(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[minimum, maximum]``.

    A value outside is a usage error (exit 2) that says so, as argparse
    reports an unknown option: ``argument --world-size: must be >= 1 (got 0)``;
    text that is no integer keeps argparse's ``invalid int value``.
    """

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise argparse.ArgumentTypeError(f"must be {bounds} (got {value}){'; ' + why if why else ''}")
        return value

    parse.__name__ = "int"  # argparse names the type after it: "invalid int value: 'x'"
    return parse


def package_version() -> str:
    """The installed distribution's version, or the package's ``__version__`` where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zephon-stream")
    except PackageNotFoundError:
        from zephon_stream import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zephon-stream",
        description="Token shards for LLM pretraining: write, inspect, verify, stream.",
        epilog=EXIT_STATUS_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
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


# What a shell reports for a command that a closed pipe stopped
# (128 + SIGPIPE), as `seq 1000000 | head -1` shows under `set -o pipefail`;
# not 0, since the output was cut short, and not 1, which means an error.
EXIT_PIPE_CLOSED = 141


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; its exit status (``EXIT_STATUS_EPILOG``: 0 done, 1 an error or a
    failed check, 2 a usage error, 130 interrupted, 141 stdout's reader went away).

    A reader that closes the pipe early (``| head -1``) ends the command
    quietly, without a traceback, at its next write to stdout.
    """
    status = EXIT_PIPE_CLOSED
    try:
        try:
            status = _run(argv)
        except SystemExit:
            # argparse exits after --help or a usage error; its text is
            # flushed here so a closed pipe is caught below, not at shutdown.
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _quiet_stdout()
        # An error already reported on stderr keeps its status.
        return EXIT_PIPE_CLOSED if status == 0 else status


def _quiet_stdout() -> None:
    """Point stdout at devnull, so the interpreter's flush at exit finds no closed pipe."""
    # The recipe of the Python docs (signal module, "Note on SIGPIPE");
    # leaving SIGPIPE at its default instead would kill the process mid-write,
    # skipping every `finally` (a store's close, a helper's shutdown).
    try:
        fileno = sys.stdout.fileno()
    except (OSError, ValueError):  # a stdout without a descriptor (replaced, closed)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fileno)
    finally:
        os.close(devnull)


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
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
