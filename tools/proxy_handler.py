"""The HTTP side of tools/fault_proxy.py: a threaded server and its handler, which
forwards each request to the upstream server or answers it with the fault the
proxy drew (an error status, a reset, a stall, a slow or cut body) or with the
store's throttling answer beyond the rate limit."""

from __future__ import annotations

import http.client
import http.server
import socket
import socketserver
import struct
import sys
import time
from typing import Any, Protocol

from tools.rate_limit import RateLimiter, throttle_answer

_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"})
_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>injected by fault proxy</Message><RequestId>fault-proxy</RequestId></Error>"
)
_IDLE_TIMEOUT_S = 30.0
_UPSTREAM_TIMEOUT_S = 60.0


class Faults(Protocol):
    """What the handler asks of its proxy (``FaultProxy``): where to forward, and which fault to answer with."""

    upstream_host: str
    upstream_port: int
    latency_s: float
    stall_s: float
    slow_body_s: float
    drip_pieces: int
    limiter: RateLimiter

    def _register(self, conn: socket.socket) -> None: ...

    def _unregister(self, conn: socket.socket) -> None: ...

    def _refuses_presigned(self, path: str) -> bool: ...

    def _admit(self, path: str) -> bool: ...

    def _draw(self, method: str, path: str, byte_range: str = "") -> str | None: ...

    def _count(self, kind: str) -> None: ...


class ProxyServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 overflows when a store opens
    # 64 connections at once on a busy machine: the kernel then drops the
    # handshake's last ACK, the client sends its request into a connection the
    # proxy never accepts, and times out -- a retry the proxy never saw.
    request_queue_size = 1024
    proxy: Faults

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that closes a connection mid-answer (a loader closing,
        # a reader that got what it needed) is routine here, not a fault to print.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = _IDLE_TIMEOUT_S
    server: ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Without TCP_NODELAY, headers and body in separate segments meet
        # the client's delayed ACK and every request pays ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._upstream: http.client.HTTPConnection | None = None
        self.server.proxy._register(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            if self._upstream is not None:
                self._upstream.close()
            self.server.proxy._unregister(self.connection)

    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reset(self) -> None:
        # SO_LINGER 0 makes close() send RST, which is what a crashed
        # endpoint or a middlebox dropping the flow looks like to the client.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _send_error_xml(self, status: int, code: str) -> None:
        body = _ERROR_BODY.format(code=code).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_throttled(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, body: bytes) -> http.client.HTTPResponse:
        proxy = self.server.proxy
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for attempt in range(2):
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=_UPSTREAM_TIMEOUT_S
                )
                self._upstream.connect()
                self._upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self._upstream.request(self.command, self.path, body=body, headers=headers)
                return self._upstream.getresponse()
            except (ConnectionError, http.client.HTTPException, OSError):
                # A kept-alive upstream connection may have been closed
                # by the server; one fresh connection is tried before failing.
                self._upstream.close()
                self._upstream = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def _proxy(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        if proxy._refuses_presigned(self.path):
            self._send_error_xml(403, "AccessDenied")
            return
        if not proxy._admit(self.path):
            if proxy.latency_s:
                time.sleep(proxy.latency_s)
            self._send_throttled(*throttle_answer(proxy.limiter.style, self.command))
            return
        byte_range = self.headers.get("Range") or self.headers.get("x-ms-range") or ""  # Azure's own header
        fault = proxy._draw(self.command, self.path, byte_range)
        if proxy.latency_s:
            time.sleep(proxy.latency_s)
        if fault == "error_500":
            self._send_error_xml(500, "InternalError")
            return
        if fault == "error_503":
            self._send_error_xml(503, "ServiceUnavailable")
            return
        if fault == "error_429":
            self._send_error_xml(429, "TooManyRequests")
            return
        if fault == "error_403":
            self._send_error_xml(403, "AccessDenied")
            return
        if fault == "reset":
            self._reset()
            return
        if fault == "stall":
            time.sleep(proxy.stall_s)
        try:
            response = self._forward(body)
            payload = response.read()
        except (OSError, http.client.HTTPException):
            proxy._count("bad_gateway")
            self._send_error_xml(502, "BadGateway")
            return
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in _HOP_HEADERS and key.lower() != "content-length":
                self.send_header(key, value)
        if self.command == "HEAD":
            length = response.getheader("Content-Length")
            if length is not None:
                self.send_header("Content-Length", length)
        else:
            self.send_header("Content-Length", str(len(payload)))
        if fault == "truncate" and self.command != "HEAD":
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.end_headers()
        if self.command == "HEAD" or not payload:
            return
        if fault == "slow_body":
            pieces = max(1, proxy.drip_pieces)
            step = max(1, -(-len(payload) // pieces))
            for offset in range(0, len(payload), step):
                self.wfile.write(payload[offset : offset + step])
                self.wfile.flush()
                time.sleep(proxy.slow_body_s / pieces)
            return
        self.wfile.write(payload)
