"""An HTTP proxy on loopback that injects storage faults in front of an object-store server.

Per request, with configured probabilities drawn from a seeded generator, it
answers 500, 503, 429 or 403 without forwarding, resets the connection, stalls before
forwarding, drips the response body slowly, or sends fewer body bytes than
Content-Length and closes. Or, deterministically, it answers every Nth
request eligible for faults with one kind (``fail_every``, ``fail_kind``).
It can also add a fixed latency to every request,
refuse the first N requests made on a presigned URL (a store that takes no
query-string signatures, or a URL that expired), and it can be stopped and
started again on the same port to play an endpoint that drops out.
``counts()`` says what it injected, how many requests came on presigned
URLs (``presigned``) and how many the upstream server failed (``bad_gateway``,
answered 502); ``failed()`` adds up the requests a client saw fail;
``injected()`` lists each fault with the request it answered.

It can also limit the request rate as a store does (``rate_limit``, a token
bucket per prefix; tools/rate_limit.py says what a prefix is) and answer
beyond it in the store's words: S3's 503 ``SlowDown``, GCS's 429
``rateLimitExceeded``, Azure's 503 ``ServerBusy`` (``throttle_style``). Those answers are counted as
``throttled``, apart from the fault kinds (a throttled request draws no fault,
so the seeded draws of the others stay as they are); ``timeline()`` says how
many requests each second it served and throttled, and ``set_rate_limit()``
changes the limit while it runs. The HTTP side (server and handler) is
tools/proxy_handler.py; this module holds the proxy's settings and counts.

Library use::

    with FaultProxy(upstream=s3.endpoint_url, rates={"error_503": 0.1}, seed=1) as proxy:
        store = open_store("s3://bucket/x", {..., "endpoint_url": proxy.endpoint_url})

Script use (runs until interrupted, prints the counts as JSON on exit)::

    python tools/fault_proxy.py --upstream http://127.0.0.1:5000 --rate reset=0.05 --latency-ms 50
    python tools/fault_proxy.py --upstream http://127.0.0.1:8333 --fail-every 4
    python tools/fault_proxy.py --upstream http://127.0.0.1:8333 --rate-limit 100:200 --throttle-style s3
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

if __package__ in (None, ""):
    # Run as a script, tools/ is not a package; its parent makes it one.
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from tools.proxy_handler import ProxyHandler, ProxyServer  # noqa: E402
from tools.rate_limit import THROTTLE_STYLES, RateLimiter, parse_rate_limit  # noqa: E402

# New kinds go last: the seeded draws of the earlier ones stay as they were.
FAULT_KINDS = ("error_500", "error_503", "reset", "stall", "slow_body", "truncate", "error_429", "error_403")


def _positive_or_none(every: int | None) -> int | None:
    if every is not None and (not isinstance(every, int) or every < 1):
        raise ValueError(f"fault proxy: fail_every must be a positive integer or None (got {every!r})")
    return every


class FaultProxy:
    """A fault-injecting HTTP proxy on 127.0.0.1, as a context manager.

    Args:
        upstream: the server to forward to, ``http://host:port``.
        rates: probability per request of each fault kind (``FAULT_KINDS``);
            at most one fault per request, so the rates must sum to <= 1.
        seed: seed of the generator that draws the faults.
        port: port to listen on (0: a free one); restarts reuse it.
        latency_s: sleep added before every request is answered.
        stall_s: how long a ``stall`` waits before forwarding.
        slow_body_s: how long a ``slow_body`` takes to drip its body.
        fault_methods: HTTP methods eligible for faults (None: all).
        fault_paths: substrings of the request path (the object's key, e.g.
            ``manifest.json``, ``shards/``), one of which makes a request
            eligible for faults (None: every path). Requests not eligible
            draw nothing, so the faults of those that are stay seeded.
        refuse_presigned: requests on a presigned URL (a signature in the
            query string) answered 403 AccessDenied, from the first.
        rate_limit: requests per second each prefix is served (None: no
            limit); beyond it, and past ``burst``, requests are throttled.
        burst: a prefix's token bucket (None: one second's worth).
        throttle_style: ``s3`` (503 SlowDown), ``gcs`` (429
            rateLimitExceeded) or ``azure`` (503 ServerBusy).
        prefix_depth: key folders after the bucket in a prefix.
        fail_every: answer every Nth request eligible for faults (counted
            from the proxy's start, or from ``set_fail_every``) with
            ``fail_kind`` instead of drawing (None: draw every request).
        fail_kind: the fault kind ``fail_every`` injects (``FAULT_KINDS``).
    """

    def __init__(
        self,
        *,
        upstream: str,
        rates: Mapping[str, float] | None = None,
        seed: int = 0,
        port: int = 0,
        latency_s: float = 0.0,
        stall_s: float = 1.0,
        slow_body_s: float = 0.5,
        drip_pieces: int = 10,
        fault_methods: tuple[str, ...] | None = None,
        fault_paths: tuple[str, ...] | None = None,
        host: str = "127.0.0.1",
        refuse_presigned: int = 0,
        rate_limit: float | None = None,
        burst: float | None = None,
        throttle_style: str = "s3",
        prefix_depth: int = 1,
        fail_every: int | None = None,
        fail_kind: str = "error_503",
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"fault proxy upstream {upstream!r}: expected http://host:port")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port
        self.rates = dict(rates or {})
        unknown = set(self.rates) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"fault proxy: unknown fault kinds {sorted(unknown)} (known: {FAULT_KINDS})")
        if sum(self.rates.values()) > 1.0 + 1e-9 or min(self.rates.values(), default=0.0) < 0:
            raise ValueError(f"fault proxy: rates must be >= 0 and sum to <= 1 (got {self.rates})")
        self.latency_s = latency_s
        self.stall_s = stall_s
        self.slow_body_s = slow_body_s
        self.drip_pieces = drip_pieces
        if fail_kind not in FAULT_KINDS:
            raise ValueError(f"fault proxy: unknown fail_kind {fail_kind!r} (known: {FAULT_KINDS})")
        self.fail_kind = fail_kind
        self._fail_every, self._fail_left, self._eligible = _positive_or_none(fail_every), None, 0
        self._injected: list[tuple[str, str, str, str]] = []
        self.fault_methods = tuple(m.upper() for m in fault_methods) if fault_methods else None
        self.fault_paths = tuple(fault_paths) if fault_paths else None
        self.refuse_presigned = refuse_presigned
        self._host = host
        self._port = port
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.limiter = RateLimiter(rate_per_s=rate_limit, burst=burst, style=throttle_style, prefix_depth=prefix_depth)
        self._counts = dict.fromkeys(
            ("requests", "presigned", "presigned_refused", "bad_gateway", "throttled", *FAULT_KINDS), 0
        )
        self._server: ProxyServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def set_rates(self, rates: Mapping[str, float]) -> None:
        """Change the fault rates of later requests."""
        with self._lock:
            self.rates = dict(rates)

    def set_fail_every(self, every: int | None, *, times: int | None = None) -> None:
        """Answer every ``every``-th eligible request from now on with ``fail_kind`` (None: stop),
        ``times`` times at most (None: no end); ``set_fail_every(1, times=1)`` fails the next one."""
        with self._lock:
            self._fail_every, self._fail_left, self._eligible = _positive_or_none(every), times, 0

    def injected(self) -> list[tuple[str, str, str, str]]:
        """``(kind, method, path, range)`` of each fault injected so far, in order: the path
        decoded and without its query string (where a presigned URL carries its signature),
        the request's byte range header or ``""``."""
        with self._lock:
            return list(self._injected)

    def set_rate_limit(self, rate_per_s: float | None, burst: float | None = None) -> None:
        """Change the request-rate limit of later requests (None: none)."""
        self.limiter.set_rate(rate_per_s, burst)

    def timeline(self) -> list[tuple[int, int, int]]:
        """``(second, served, throttled)`` for each second since the proxy was made (``RateLimiter.timeline``).

        Served counts every request the rate limit let through, faults
        injected on it included.
        """
        return self.limiter.timeline()

    def counts(self) -> dict[str, int]:
        """Requests seen and faults injected, by kind.

        Besides ``requests`` and each of ``FAULT_KINDS``: ``presigned``
        (requests on a presigned URL), ``presigned_refused`` (those answered
        403 by ``refuse_presigned``), ``throttled`` (those answered beyond
        the rate limit) and ``bad_gateway`` (requests the upstream server
        failed, answered 502).
        """
        with self._lock:
            return dict(self._counts)

    def failed(self, kinds: tuple[str, ...] = FAULT_KINDS) -> int:
        """Requests answered with a failure of one of ``kinds``, or 502 because the upstream server failed.

        Each is one request a client sees fail: a store retrying transient
        failures makes exactly this many retries, when ``kinds`` are the
        transient ones among those configured.
        """
        with self._lock:
            return sum(self._counts[kind] for kind in kinds) + self._counts["bad_gateway"]

    def _count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def start(self) -> FaultProxy:
        """Listen (again) on the proxy's port."""
        if self._server is not None:
            return self
        deadline = time.monotonic() + 10.0
        while True:
            try:
                server = ProxyServer((self._host, self._port), ProxyHandler)
                break
            except OSError:
                # Right after stop() the old socket may linger briefly.
                if not self._port or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        server.proxy = self
        self._server = server
        self._port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.name = f"fault-proxy-{self._port}"
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection; ``start()`` resumes on the same port."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def outage(self, seconds: float) -> None:
        """Stop, wait ``seconds``, start again on the same port."""
        self.stop()
        time.sleep(seconds)
        self.start()

    def _register(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def _unregister(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _refuses_presigned(self, path: str) -> bool:
        query = urllib.parse.urlsplit(path).query
        # S3 SigV2 ``Signature``, SigV4 ``X-Amz-Signature``, an Azure SAS's ``sig``.
        if "Signature=" not in query and "sig=" not in query:
            return False
        with self._lock:
            self._counts["presigned"] += 1
            if self._counts["presigned_refused"] < self.refuse_presigned:
                self._counts["presigned_refused"] += 1
                return True
        return False

    def _admit(self, path: str) -> bool:
        if self.limiter.admit(path):
            return True
        with self._lock:
            self._counts["requests"] += 1
            self._counts["throttled"] += 1
        return False

    def _draw(self, method: str, path: str, byte_range: str = "") -> str | None:
        # GCS's JSON API puts the object's name in the path
        # percent-encoded (``shards%2F00000001.zst``).
        plain = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        with self._lock:
            self._counts["requests"] += 1
            if self.fault_methods is not None and method.upper() not in self.fault_methods:
                return None
            if self.fault_paths is not None and not any(part in plain for part in self.fault_paths):
                return None
            chosen = None
            if self._fail_every is not None and self._fail_left != 0:
                self._eligible += 1
                if self._eligible % self._fail_every == 0:
                    chosen = self.fail_kind
                    self._fail_left = None if self._fail_left is None else self._fail_left - 1
            if chosen is None:
                u = self._rng.random()
                cumulative = 0.0
                for kind in FAULT_KINDS:
                    cumulative += self.rates.get(kind, 0.0)
                    if u < cumulative:
                        chosen = kind
                        break
            if chosen is None:
                return None
            if chosen == "truncate" and method.upper() == "HEAD":
                chosen = "reset"
            self._counts[chosen] += 1
            self._injected.append((chosen, method.upper(), plain, byte_range))
            return chosen

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        limit = f", rate_limit={self.limiter.rate_per_s}" if self.limiter.rate_per_s is not None else ""
        return (
            f"FaultProxy({self.endpoint_url} -> {self.upstream_host}:{self.upstream_port}, rates={self.rates}{limit})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="server to forward to, http://host:port")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    parser.add_argument(
        "--rate", action="append", default=[], metavar="KIND=P", help=f"fault rate; KIND in {FAULT_KINDS}"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="latency added to every request")
    parser.add_argument("--stall-s", type=float, default=1.0)
    parser.add_argument("--slow-body-s", type=float, default=0.5)
    parser.add_argument(
        "--refuse-presigned",
        type=int,
        default=0,
        metavar="N",
        help="answer the first N requests on a presigned URL 403 AccessDenied",
    )
    parser.add_argument(
        "--rate-limit",
        type=parse_rate_limit,
        default=None,
        metavar="RATE[:BURST]",
        help="requests per second served per prefix, and its token bucket (default: one second's)",
    )
    parser.add_argument(
        "--throttle-style",
        choices=THROTTLE_STYLES,
        default="s3",
        help="answer beyond the limit: s3 (503 SlowDown), gcs (429 rateLimitExceeded), azure",
    )
    parser.add_argument("--prefix-depth", type=int, default=1, help="key folders after the bucket in a prefix")
    parser.add_argument(
        "--fail-every",
        type=int,
        default=None,
        metavar="N",
        help="answer every Nth request eligible for faults with --fail-kind",
    )
    parser.add_argument("--fail-kind", choices=FAULT_KINDS, default="error_503")
    args = parser.parse_args(argv)
    rate_limit, burst = args.rate_limit or (None, None)
    rates = {}
    for item in args.rate:
        kind, _, value = item.partition("=")
        rates[kind] = float(value)
    proxy = FaultProxy(
        upstream=args.upstream,
        rates=rates,
        seed=args.seed,
        port=args.port,
        latency_s=args.latency_ms / 1000.0,
        stall_s=args.stall_s,
        slow_body_s=args.slow_body_s,
        refuse_presigned=args.refuse_presigned,
        rate_limit=rate_limit,
        burst=burst,
        throttle_style=args.throttle_style,
        prefix_depth=args.prefix_depth,
        fail_every=args.fail_every,
        fail_kind=args.fail_kind,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with proxy:
        every = f" fail_every={args.fail_every} ({args.fail_kind})" if args.fail_every else ""
        print(f"fault proxy: {proxy.endpoint_url} -> {args.upstream} rates={rates}{every}", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    if rate_limit is not None:
        print(json.dumps({"timeline": proxy.timeline()}), flush=True)
    print(json.dumps(proxy.counts()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
