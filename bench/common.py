"""Shared benchmark plumbing: rounds, medians and spreads, tables, JSON results."""

from __future__ import annotations

import http.client
import json
import os
import platform
import random
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"


class Poster:
    """POST a JSON body to the API on a keep-alive connection per thread (one retry on
    a connection the server closed); returns the status and the body. The headers of a
    thread's last answer are ``headers()``."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.local = threading.local()

    def headers(self) -> dict[str, str]:
        return dict(getattr(self.local, "headers", {}))

    def post(self, path: str, body: str) -> tuple[int, bytes]:
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                                    timeout=120)
            try:
                conn.request("POST", path, body, {"Authorization": f"Bearer {self.key}",
                                                  "Content-Type": "application/json"})
                resp = conn.getresponse()
                self.local.headers = dict(resp.getheaders())  # this thread's last answer's
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poisson_arrivals(rng: random.Random, rate: float, window: float) -> Iterator[float]:
    """A Poisson process of ``rate`` per second for ``window`` seconds: yields each
    arrival when it is due, as its scheduled ``time.perf_counter()``."""
    start, at = time.perf_counter(), 0.0
    while True:
        at += rng.expovariate(rate)
        if at > window:
            return
        time.sleep(max(0.0, start + at - time.perf_counter()))
        yield start + at


def spread(xs: list[float]) -> str:
    med = statistics.median(xs)
    return f"{med:.3g} [{min(xs):.3g}–{max(xs):.3g}]"


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime())}


def report(name: str, title: str, columns: list[str], rows: list[list[Any]],
           data: dict[str, Any]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(escape(c), justify="right" if c != columns[0] else "left")
    for r in rows:
        table.add_row(*[escape(str(x)) for x in r])
    Console(width=140).print(table)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2))
    print(f"wrote {path}")
