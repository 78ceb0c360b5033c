"""A webhook receiver for tests: a real HTTP server on 127.0.0.1 (http.server in a
thread) that records every request and answers as its ``plan`` says, by the attempt
number of the request's ``webhook-id``: "ok" (200), "fail" (500), "hang" (no answer
for ``hang_s``: the sender's read timeout) or a status code ("302", "401": that status,
a redirect with a ``location``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    answer: str  # ok | fail | hang | a status code
    at: float

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    def __init__(self, plan: Callable[[str, int], str] | None = None,
                 hang_s: float = 3.0) -> None:
        self.plan: Callable[[str, int], str] = plan or (lambda _id, _n: "ok")
        self.hang_s = hang_s
        self.requests: list[Request] = []
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                wid = headers.get("webhook-id", "")
                with receiver.lock:
                    receiver.counts[wid] += 1
                    answer = receiver.plan(wid, receiver.counts[wid])
                    receiver.requests.append(Request(self.path, headers, body, answer,
                                                     time.time()))
                if answer == "hang":
                    time.sleep(receiver.hang_s)
                status = 200 if answer == "ok" else int(answer) if answer.isdigit() else 500
                try:
                    self.send_response(status)
                    if 300 <= status < 400:
                        self.send_header("location", "/elsewhere")
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the sender gave up waiting

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def accepted(self, path: str | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.answer == "ok"
                    and (path is None or r.path == path)]

    def wait_for(self, done: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                with self.lock:
                    seen = [(r.path, r.webhook_id, r.answer) for r in self.requests]
                raise AssertionError(f"timed out waiting for {what}; received {seen}")
            time.sleep(0.05)


@contextmanager
def receiver(plan: Callable[[str, int], str] | None = None, hang_s: float = 3.0
             ) -> Iterator[Receiver]:
    r = Receiver(plan, hang_s)
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
