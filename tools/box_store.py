"""A box's object store (tools/cluster_box.py): SeaweedFS on the bridge's address, behind a proxy that records
which node asked for what.

The nodes reach the store through the proxy (``endpoint_url``, ``env()``);
every request it answers is recorded with the address it came from, its
method, the object's key and the answer's status, so that a test counts GETs
per node at the store (``requests()``, ``gets_by_node()``). The proxy is
tools/fault_proxy.py's, so it can also limit the request rate as a store does
(``rate_limit``: a token bucket per prefix, 503 SlowDown beyond it). The
owner of the box writes datasets straight to SeaweedFS (``direct_options()``),
unrecorded.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any, NamedTuple

from tools.fault_proxy import FaultProxy
from tools.proxy_handler import ProxyHandler
from tools.seaweedfs import SeaweedFS


class StoreRequest(NamedTuple):
    """One request the store's proxy answered."""

    when: float  # time.time() at its arrival (the nodes share the machine's clock)
    client: str  # the address it came from
    method: str
    key: str  # bucket/key, decoded, without the query string
    byte_range: str  # the Range header, "" for a whole object
    status: int  # the answer's status; 0 when the proxy reset the connection instead


class _RecordingHandler(ProxyHandler):
    """The fault proxy's handler, recording each request with the address it came from."""

    def _proxy(self) -> None:
        arrived, self._status = time.time(), 0
        try:
            super()._proxy()
        finally:
            key = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
            byte_range = self.headers.get("Range", "") if self.headers is not None else ""
            self.server.proxy.record(
                StoreRequest(arrived, self.client_address[0], self.command, key, byte_range, self._status)
            )

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)


class RecordingProxy(FaultProxy):
    """``FaultProxy`` whose requests are recorded with their client's address (``requests()``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._requests: list[StoreRequest] = []
        self._requests_lock = threading.Lock()

    def start(self) -> RecordingProxy:
        super().start()
        # set before any client knows the port; the server builds a handler per connection.
        self._server.RequestHandlerClass = _RecordingHandler  # type: ignore[union-attr]
        return self

    def record(self, request: StoreRequest) -> None:
        with self._requests_lock:
            self._requests.append(request)

    def requests(self) -> list[StoreRequest]:
        with self._requests_lock:
            return list(self._requests)


class BoxStore:
    """SeaweedFS and the recording proxy, both on ``host`` (the bridge's address).

    Args:
        host: the address to serve on.
        buckets: buckets made once SeaweedFS answers.
        rate_limit: requests per second per prefix the proxy serves (None: all).
        burst: the proxy's token bucket (None: one second's worth).
    """

    def __init__(
        self,
        *,
        host: str,
        buckets: tuple[str, ...] = ("data",),
        rate_limit: float | None = None,
        burst: float | None = None,
    ) -> None:
        self.server = SeaweedFS(host=host, buckets=buckets)
        self._host = host
        self._limit = {"rate_limit": rate_limit, "burst": burst}
        self.proxy: RecordingProxy | None = None

    def start(self) -> BoxStore:
        self.server.start()
        try:
            self.proxy = RecordingProxy(upstream=self.server.endpoint_url, host=self._host, **self._limit).start()
        except BaseException:
            self.server.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        # Its data go with it, so no orderly shutdown is owed (SIGTERM takes SeaweedFS seconds).
        self.server.kill()
        self.server.stop()

    def leftover_patterns(self) -> list[str]:
        """What SeaweedFS leaves in /tmp when it is SIGKILLed: a gRPC socket per port (it removes them when stopped)."""
        return self.server.socket_patterns()

    @property
    def endpoint_url(self) -> str:
        """Where the nodes send their requests: the proxy."""
        if self.proxy is None:
            raise RuntimeError("the box's store is not started")
        return self.proxy.endpoint_url

    def env(self) -> dict[str, str]:
        """The AWS variables that point a process on a node at the store, through the proxy."""
        return {**self.server.env(), "AWS_ENDPOINT_URL": self.endpoint_url}

    def options(self) -> dict[str, Any]:
        """s3fs options reaching the store through the proxy (as the nodes do)."""
        return {**self.server.storage_options(), "endpoint_url": self.endpoint_url}

    def direct_options(self) -> dict[str, Any]:
        """s3fs options reaching SeaweedFS itself, unrecorded and unlimited."""
        return self.server.storage_options()

    def requests(self) -> list[StoreRequest]:
        """Every request the proxy answered so far, in order of arrival."""
        return self.proxy.requests() if self.proxy is not None else []

    def gets_by_client(self, key_part: str = "") -> dict[str, int]:
        """GETs answered 2xx per client address, of keys containing ``key_part``."""
        counts: dict[str, int] = {}
        for request in self.requests():
            if request.method == "GET" and 200 <= request.status < 300 and key_part in request.key:
                counts[request.client] = counts.get(request.client, 0) + 1
        return counts
