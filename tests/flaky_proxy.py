"""An HTTP proxy in front of the S3 server that fails some requests on purpose.

It forwards every request to the upstream server unchanged, except that it answers
some of them with a 503 ``SlowDown`` (what S3 sends when throttling) and drops the
connection on others without a word, in a fixed pattern: ``burst`` requests in a
row every ``every`` requests (long enough to outlast botocore's own retries), plus
every ``single``-th request on its own. The test process owns it; workers reach it
over the network like any S3 endpoint.
"""

from __future__ import annotations

import http.client
import itertools
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class FlakyProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, every: int = 60, burst: int = 6, single: int = 7) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.every, self.burst, self.single = every, burst, single
        self.counter = itertools.count(1)
        self.lock = threading.Lock()
        self.forwarded = self.throttled = self.dropped = 0
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FlakyProxy:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()
        self.server_close()

    def verdict(self) -> str:
        """'ok', 'throttle' or 'drop' for the next request."""
        with self.lock:
            n = next(self.counter)
            if n % self.every < self.burst or n % self.single == 0:
                kind = "throttle" if n % 2 else "drop"
                if kind == "throttle":
                    self.throttled += 1
                else:
                    self.dropped += 1
                return kind
            self.forwarded += 1
            return "ok"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FlakyProxy

    def log_message(self, *_: object) -> None:
        return None

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                out += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return bytes(out)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _any(self) -> None:
        body = self._body()
        verdict = self.server.verdict()
        if verdict == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if verdict == "throttle":
            self._reply(503, [("Content-Type", "application/xml")], SLOW_DOWN)
            return
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Host"] = self.headers.get("Host", "")
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self._reply(resp.status, [(k, v) for k, v in resp.getheaders()
                                      if k.lower() not in HOP_BY_HOP], data)
        finally:
            conn.close()

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any
