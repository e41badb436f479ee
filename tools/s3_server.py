"""Run an S3 server (moto) on loopback until interrupted.

Prints the endpoint and the shell lines that point the AWS tools, s3fs and
``zephon-stream`` at it; the buckets named with ``--bucket`` are created first.
Data lives in memory and is gone when the server stops.

    python tools/s3_server.py --port 5000 --bucket data
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading

from zephon_stream.storage.embedded_s3 import EmbeddedS3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run an S3 server (moto) on 127.0.0.1 until interrupted.")
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (0: a free one; a taken port is replaced)"
    )
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedS3(port=args.port, host=args.host) as server:
        for bucket in args.bucket:
            server.create_bucket(bucket)
        print(f"S3 server on {server.endpoint_url} (buckets: {', '.join(args.bucket) or 'none'})", flush=True)
        for name, value in server.env().items():
            print(f"export {name}={shlex.quote(value)}", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    print("S3 server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
