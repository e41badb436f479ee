"""A request-rate limit as object stores apply one: a token bucket per prefix,
answered beyond it in the store's own words (for tools/fault_proxy.py).

A *prefix* is what the store scales by. S3 partitions a bucket by key prefix
(about 5,500 GET/s each): here the bucket and the first ``prefix_depth``
folders of the key (``prefix_depth=1``: ``bucket/ds`` for ``ds/shards/x.zst``
and ``ds/manifest``; 0: the bucket). The request path is read path-style
(``/bucket/key``) or as GCS's JSON API names objects (``/storage/v1/b/BUCKET/o/
KEY``, ``/download/...``, ``/upload/...?name=KEY``). A request on no object (a
listing) counts against its bucket.

Each prefix has a bucket of ``burst`` tokens, full at first and refilled at
``rate_per_s``; a request takes one token or is throttled. Throttled answers:

- ``s3``: HTTP 503 with S3's ``SlowDown`` XML error ("Please reduce your request rate."); no body on HEAD.
- ``gcs``: HTTP 429 with GCS's JSON error (``error.code`` 429, ``errors[].reason`` ``rateLimitExceeded``).
- ``azure``: HTTP 503 ``ServerBusy`` ("Egress is over the account limit."), the code also in ``x-ms-error-code``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable

THROTTLE_STYLES = ("s3", "gcs", "azure")
_S3_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    "<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId>"
    "<HostId>fault-proxy</HostId></Error>"
)
_GCS_MESSAGE = "The rate of requests to this bucket is too high. Please reduce your request rate."
_GCS_BODY = json.dumps(
    {
        "error": {
            "code": 429,
            "message": _GCS_MESSAGE,
            "errors": [{"message": _GCS_MESSAGE, "domain": "usageLimits", "reason": "rateLimitExceeded"}],
        }
    }
)
_AZURE_BODY = (
    '<?xml version="1.0" encoding="utf-8"?>\n<Error><Code>ServerBusy</Code>'
    "<Message>Egress is over the account limit.\nRequestId:fault-proxy</Message></Error>"
)


def parse_rate_limit(text: str) -> tuple[float, float | None]:
    """``"RATE[:BURST]"`` -> ``(rate_per_s, burst or None)``, as ``--rate-limit`` takes it."""
    rate, _, burst = text.partition(":")
    try:
        return float(rate), (float(burst) if burst else None)
    except ValueError:
        raise ValueError(f"rate limit {text!r}: expected RATE[:BURST], numbers of requests per second") from None


def throttle_answer(style: str, method: str) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers, body)`` of a throttled request in the store ``style``'s words."""
    if style == "gcs":
        status, headers, body = 429, {"Content-Type": "application/json; charset=UTF-8"}, _GCS_BODY
    elif style == "azure":
        status, headers, body = 503, {"Content-Type": "application/xml", "x-ms-error-code": "ServerBusy"}, _AZURE_BODY
    else:
        status, headers, body = 503, {"Content-Type": "application/xml"}, _S3_BODY
    return status, headers, b"" if method.upper() == "HEAD" else body.encode()


def request_prefix(path: str, depth: int) -> str:
    """The prefix a request counts against: its bucket and the first ``depth`` folders of its key."""
    parts = urllib.parse.urlsplit(path)
    segments = [urllib.parse.unquote(s) for s in parts.path.split("/") if s]
    if "storage" in segments and "b" in segments:
        where = segments.index("b")
        bucket = segments[where + 1]
        rest = segments[where + 2 :]
        key = "/".join(rest[1:]) if rest[:1] == ["o"] else ""
        key = key or urllib.parse.parse_qs(parts.query).get("name", [""])[0]
    else:
        bucket, key = (segments[0] if segments else ""), "/".join(segments[1:])
    folders = key.split("/")[:-1][:depth]
    return "/".join([bucket, *folders])


class RateLimiter:
    """Token buckets per prefix, and how many requests each second it served and throttled.

    Args:
        rate_per_s: tokens added to each prefix's bucket per second; None: no limit.
        burst: a bucket's size, and its tokens at first (None: ``max(1, rate_per_s)``,
            one second's worth); under 1 serves nothing.
        style: how a throttled request is answered (``THROTTLE_STYLES``).
        prefix_depth: key folders in a prefix after the bucket.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        rate_per_s: float | None = None,
        burst: float | None = None,
        style: str = "s3",
        prefix_depth: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if style not in THROTTLE_STYLES:
            raise ValueError(f"throttle style {style!r}: expected one of {THROTTLE_STYLES}")
        if prefix_depth < 0:
            raise ValueError(f"prefix depth must be >= 0 (got {prefix_depth})")
        self.style = style
        self.prefix_depth = prefix_depth
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._buckets: dict[str, tuple[float, float]] = {}  # prefix -> (tokens, when)
        self._seconds: dict[int, list[int]] = {}  # second -> [served, throttled]
        self.rate_per_s: float | None = None
        self.burst = 0.0
        self.set_rate(rate_per_s, burst)

    def set_rate(self, rate_per_s: float | None, burst: float | None = None) -> None:
        """Change the limit from now on; a bucket keeps its tokens, up to the new burst."""
        if rate_per_s is not None and not rate_per_s >= 0 or burst is not None and not burst >= 0:
            raise ValueError(f"rate limit: rate and burst must be >= 0 (got {rate_per_s}, {burst})")
        with self._lock:
            now = self._clock()
            for prefix in list(self._buckets):
                self._buckets[prefix] = (self._tokens(prefix, now), now)
            self.rate_per_s = rate_per_s
            self.burst = float(burst) if burst is not None else max(1.0, rate_per_s or 0.0)
            self._buckets = {p: (min(t, self.burst), w) for p, (t, w) in self._buckets.items()}

    def _tokens(self, prefix: str, now: float) -> float:
        tokens, when = self._buckets.get(prefix, (self.burst, now))
        return min(self.burst, tokens + (now - when) * (self.rate_per_s or 0.0))

    def admit(self, path: str) -> bool:
        """Whether the request on ``path`` is served (it takes a token) or throttled; counted either way."""
        with self._lock:
            now = self._clock()
            served = True
            if self.rate_per_s is not None:
                prefix = request_prefix(path, self.prefix_depth)
                tokens = self._tokens(prefix, now)
                served = tokens >= 1.0
                self._buckets[prefix] = (tokens - 1.0 if served else tokens, now)
            second = self._seconds.setdefault(int(now - self._started), [0, 0])
            second[0 if served else 1] += 1
            return served

    def timeline(self) -> list[tuple[int, int, int]]:
        """``(second, served, throttled)`` for each whole second since the limiter was made, up to the last request."""
        with self._lock:
            last = max(self._seconds, default=-1)
            return [(s, *self._seconds.get(s, (0, 0))) for s in range(last + 1)]  # type: ignore[misc]
