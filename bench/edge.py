"""The API's edge under many connections: the latency of one embeddings request while
the API holds N idle keep-alive connections, N slow-header clients or N batch event
followers, against the same request on the idle API just before, in one run.

One stack (embedded backends, one API process, one model worker on the realtime lane
only, so the followed batches stay ``in_progress``: no worker takes their shards).
The measured request: ``POST /v1/embeddings`` of one short text (--text) for the
stack's embeddings model, --requests of them one after another on one keep-alive
connection from 127.0.0.1, after --warmup; p50 and p99 of their latency. For each N of
--n and each load kind of --kinds, separately:
- idle: the measured requests on the idle API;
- then with the load held, the same requests. Load kinds:
  ``idle``: N keep-alive connections, each made one ``GET /healthz`` and then stays
  open, idle; ``slow``: N clients that send a request line, then one header byte a
  second (never the end of the headers), opened evenly over one header timeout
  (``api_header_timeout_s``); one the server closes is opened again at once, so N stay
  open; ``sse``: N followers of ``GET /v1/batches/{id}/events`` spread evenly over
  --projects projects (made through the Admin API) and their --batches batches each
  (--batch-rows embeddings requests, in progress the whole run).
  Recorded: connections held (the load generator's count, sampled every second while
  measuring; the least is reported) and those still waiting for an answer; the ends by
  status (408, 429, 503 apart; "other": any other status, closes without one,
  connections the server closed after they were held, connect errors); the API
  process's RSS, threads and descriptors (psutil: the gunicorn worker, a child of the
  master the stack started), and its own count of TCP connections from the load's
  addresses.
- the idle measurement once more at the end; the table's first row is the median of
  all idle measurements, each row's ratio is against the one just before it.

Load comes from a child process (one ``selectors`` loop over non-blocking sockets), so
the measured requests, a plain blocking ``http.client`` connection in this process,
never queue behind it. Load connections are bound to source addresses 127.0.0.2,
127.0.0.3, ... (at most --per-address each, under the API's per-client cap); traffic
goes to loopback only. A connection answered with a status other than 200 is not tried
again (idle, sse; a slow client opens another, after --retry-s unless it was a 408); one
the server closes after it was held (keep-alive timeout, a stream's end) is opened again
after --retry-s. A measured request that takes longer than --timeout is a timeout
(infinite latency in the percentiles); after --max-timeouts of them, or --measure-s,
the row's measurement stops. Between rows the load is closed and the API left to
settle (no connection from a load address left, /healthz answering), at most
--settle-s.

``--server gthread`` runs the API as gunicorn's threaded worker (64 threads) instead of
the stack's own server, for comparison on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import heapq
import http.client
import json
import math
import multiprocessing
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.common import free_port, report

KINDS = ("idle", "slow", "sse")
TEXT = "The quick brown fox jumps over the lazy dog."
HOST = "127.0.0.1"
# Linux: pick the source port at connect (per destination), not at bind.
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
SLOW_HEADER = b"X-Edge-Slow: " + b"a" * 100_000
FD_MARGIN = 256  # descriptors the load process keeps free of load sockets


# Load generator (the child process) ------------------------------------------------------

# Slot states.
WAIT, CONNECTING, RESPONSE, HELD, DRIP, DONE = range(6)


class Slot:
    __slots__ = ("index", "addr", "request", "sock", "state", "buf", "gen", "opened",
                 "dripped", "tail")

    def __init__(self, index: int, addr: str, request: bytes) -> None:
        self.index, self.addr, self.request = index, addr, request
        self.sock: socket.socket | None = None
        self.state = WAIT
        self.buf = b""
        self.gen = 0  # bumped at every (re)connect: stale timer entries are skipped
        self.opened = 0.0
        self.dripped = 0
        self.tail = b""


@dataclass
class LoadSpec:
    kind: str
    n: int
    port: int
    addrs: list[str]
    per_address: int
    requests: list[bytes]  # one per slot group (sse: one per project), slot i takes i % len
    retry_s: float
    drip_s: float
    connect_cap: int  # ramp: at most this many connecting or awaiting an answer at once
    deadline_s: float
    spread_s: float = 0.0  # first connects spread evenly over this (0: as fast as allowed)


@dataclass
class LoadState:
    statuses: Counter[str] = field(default_factory=Counter)  # refusals/ends by status
    connect_errors: Counter[str] = field(default_factory=Counter)
    closed_by_server: int = 0  # held connections the server closed (or streams it ended)
    reconnects: int = 0
    ever_held: int = 0
    lifetimes: list[float] = field(default_factory=list)  # slow: open → closed by server


class Load:
    """N slots of one kind, each a non-blocking socket driven by one selector."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.sel = selectors.DefaultSelector()
        self.slots = [Slot(i, spec.addrs[i // spec.per_address],
                           spec.requests[i % len(spec.requests)]) for i in range(spec.n)]
        self.timers: list[tuple[float, int, int, int]] = []  # (due, seq, slot, gen)
        self.seq = 0
        self.counts = Counter({WAIT: spec.n})
        self.state = LoadState()
        self.started = 0  # slots that have connected once
        self.next = 0  # the ramp's next slot
        if spec.spread_s > 0:
            for s in self.slots:
                self.later(s, s.index * spec.spread_s / spec.n)
            self.next = spec.n

    # state bookkeeping
    def move(self, s: Slot, state: int) -> None:
        self.counts[s.state] -= 1
        self.counts[state] += 1
        s.state = state
        if state in (HELD, DRIP):
            self.state.ever_held = max(self.state.ever_held, self.held())

    def held(self) -> int:
        return self.counts[DRIP] if self.spec.kind == "slow" else self.counts[HELD]

    def later(self, s: Slot, delay: float) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (time.monotonic() + delay, self.seq, s.index, s.gen))

    def stats(self) -> dict[str, Any]:
        st = self.state
        return {"kind": self.spec.kind, "n": self.spec.n, "started": self.started,
                "held": self.held(), "ever_held": st.ever_held,
                "connecting": self.counts[CONNECTING], "waiting": self.counts[RESPONSE],
                "retrying": self.counts[WAIT] - (self.spec.n - self.started),
                "given_up": self.counts[DONE], "statuses": dict(st.statuses),
                "connect_errors": dict(st.connect_errors),
                "closed_by_server": st.closed_by_server, "reconnects": st.reconnects,
                "slow_closes": len(st.lifetimes),
                "slow_lifetime_median_s": (statistics.median(st.lifetimes)
                                           if st.lifetimes else None)}

    # connections
    def connect(self, s: Slot) -> None:
        if s.gen == 0:
            self.started += 1
        s.gen += 1
        s.buf, s.tail, s.dripped = b"", b"", 0
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((s.addr, 0))
            rc = sock.connect_ex((HOST, self.spec.port))
        except OSError as e:
            sock.close()
            self.state.connect_errors[errno.errorcode.get(e.errno or 0, str(e))] += 1
            self.move(s, WAIT)
            self.later(s, self.spec.retry_s)
            return
        if rc not in (0, errno.EINPROGRESS):
            sock.close()
            self.state.connect_errors[errno.errorcode.get(rc, str(rc))] += 1
            self.move(s, WAIT)
            self.later(s, self.spec.retry_s)
            return
        s.sock, s.opened = sock, time.monotonic()
        self.move(s, CONNECTING)
        self.sel.register(sock, selectors.EVENT_WRITE, s)

    def drop(self, s: Slot) -> None:
        if s.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(s.sock)
            s.sock.close()
            s.sock = None
        s.gen += 1

    def end(self, s: Slot, status: str | None, retry: float | None) -> None:
        """The connection ended: ``status`` is the answer that ended it (None: closed
        with none); ``retry``: seconds before the slot connects again (None: never)."""
        if self.spec.kind == "slow" and s.state == DRIP:
            self.state.lifetimes.append(time.monotonic() - s.opened)
            del self.state.lifetimes[:-20_000]
        self.drop(s)
        if status is not None:
            self.state.statuses[status] += 1
        if retry is None:
            self.move(s, DONE)
            return
        self.move(s, WAIT)
        self.state.reconnects += 1
        if retry <= 0:
            self.connect(s)
        else:
            self.later(s, retry)

    def on_writable(self, s: Slot) -> None:
        assert s.sock is not None
        err = s.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.state.connect_errors[errno.errorcode.get(err, str(err))] += 1
            self.drop(s)
            self.move(s, WAIT)
            self.later(s, self.spec.retry_s)
            return
        try:
            sent = s.sock.send(s.request)
        except OSError as e:
            self.state.connect_errors[errno.errorcode.get(e.errno or 0, str(e))] += 1
            self.end(s, None, self.spec.retry_s)
            return
        if sent != len(s.request):  # a fresh socket takes a few hundred bytes whole
            self.state.connect_errors["partial_send"] += 1
            self.end(s, None, self.spec.retry_s)
            return
        self.sel.modify(s.sock, selectors.EVENT_READ, s)
        if self.spec.kind == "slow":
            self.move(s, DRIP)
            self.later(s, self.spec.drip_s)
        else:
            self.move(s, RESPONSE)

    def on_readable(self, s: Slot) -> None:
        assert s.sock is not None
        try:
            data = s.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        kind, retry = self.spec.kind, self.spec.retry_s
        if not data:  # closed by the server
            if s.state == RESPONSE or (kind == "slow" and not s.buf):
                if kind == "slow":
                    self.end(s, "closed", 0)
                else:
                    self.end(s, "closed", retry)
                return
            if kind == "slow":
                status = _status(s.buf)
                self.end(s, status or "closed", 0 if status in (None, "408") else retry)
                return
            self.state.closed_by_server += 1
            self.end(s, None, retry)
            return
        if s.state == HELD:
            if kind == "sse":  # a stream that ends (chunked terminator) is followed again
                s.tail = (s.tail + data)[-7:]
                if s.tail.endswith(b"\r\n0\r\n\r\n") or s.tail == b"0\r\n\r\n":
                    self.state.closed_by_server += 1
                    self.end(s, None, retry)
            return
        s.buf += data
        if kind == "slow":  # an answer before the headers ended: wait for the close
            return
        head_end = s.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        status = _status(s.buf) or "unparsed"
        if status != "200":
            self.end(s, status, None)
            return
        if kind == "sse":
            s.tail = s.buf[-7:]
            s.buf = b""
            self.move(s, HELD)
            return
        length = _content_length(s.buf[:head_end])
        if length is None or len(s.buf) >= head_end + 4 + length:
            s.buf = b""
            self.move(s, HELD)

    def on_timer(self, s: Slot) -> None:
        if s.state == WAIT:
            self.connect(s)
        elif s.state == DRIP and s.sock is not None:
            at = s.dripped % len(SLOW_HEADER)
            byte = SLOW_HEADER[at:at + 1]
            try:
                s.sock.send(byte)
            except BlockingIOError:
                pass
            except OSError:
                status = _status(s.buf)
                self.end(s, status or "closed", 0 if status in (None, "408") else
                         self.spec.retry_s)
                return
            s.dripped += 1
            self.later(s, self.spec.drip_s)

    def run(self, pipe: Connection) -> None:
        spec = self.spec
        deadline = time.monotonic() + spec.deadline_s
        while time.monotonic() < deadline:
            now = time.monotonic()
            # ramp up: new slots, at most connect_cap connecting or awaiting an answer
            budget = spec.connect_cap - self.counts[CONNECTING] - self.counts[RESPONSE]
            while self.next < spec.n and budget > 0:
                s = self.slots[self.next]
                self.next += 1
                budget -= 1
                self.connect(s)
            while self.timers and self.timers[0][0] <= now:
                _, _, i, gen = heapq.heappop(self.timers)
                s = self.slots[i]
                if s.gen == gen:
                    self.on_timer(s)
            wait = 0.05
            if self.timers:
                wait = min(wait, max(0.0, self.timers[0][0] - time.monotonic()))
            for key, mask in self.sel.select(wait):
                s = key.data
                if s.sock is None:
                    continue
                if mask & selectors.EVENT_WRITE and s.state == CONNECTING:
                    self.on_writable(s)
                elif mask & selectors.EVENT_READ:
                    self.on_readable(s)
            if pipe.poll():
                cmd = pipe.recv()
                if cmd == "stop":
                    break
                pipe.send(self.stats())
        for s in self.slots:
            self.drop(s)
        with contextlib.suppress(OSError):
            pipe.send(self.stats())


def _status(buf: bytes) -> str | None:
    line = buf.split(b"\r\n", 1)[0]
    if not line.startswith(b"HTTP/") or b"\r\n" not in buf:
        return None
    parts = line.split(b" ", 2)
    return parts[1].decode("ascii", "replace") if len(parts) > 1 else None


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value.strip())
    return None


def raise_fd_limit() -> int:
    """The soft limit on open descriptors raised to the hard one; returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def load_main(spec: LoadSpec, pipe: Connection) -> None:
    limit = raise_fd_limit()
    if spec.n + FD_MARGIN > limit:
        pipe.send({"error": f"{spec.n} connections need more descriptors than the limit "
                            f"({limit})"})
        return
    pipe.send({"ready": True})
    Load(spec).run(pipe)


class Held:
    """The load child, seen from the benchmark: its stats on demand, stopped at exit."""

    def __init__(self, spec: LoadSpec) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.proc = ctx.Process(target=load_main, args=(spec, child), daemon=True)
        self.lock = threading.Lock()
        self.final: dict[str, Any] | None = None
        self.last: dict[str, Any] = {}
        self.proc.start()
        child.close()
        if not self.pipe.poll(60):
            raise RuntimeError("the load process did not start")
        hello = self.pipe.recv()
        if "error" in hello:
            raise RuntimeError(hello["error"])

    def stats(self) -> dict[str, Any]:
        with self.lock:
            if self.final is not None:
                return self.final
            try:
                self.pipe.send("stats")
                if not self.pipe.poll(30):
                    raise RuntimeError("the load process stopped answering")
                self.last = self.pipe.recv()
            except (OSError, EOFError):  # it passed its deadline and ended
                self.final = self.last
            return self.last

    def stop(self) -> dict[str, Any]:
        with self.lock:
            if self.final is None:
                try:
                    self.pipe.send("stop")
                    self.final = self.pipe.recv() if self.pipe.poll(30) else {}
                except (OSError, EOFError):
                    self.final = {}
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
            return self.final


# The measured side (this process) --------------------------------------------------------


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


@dataclass
class Measured:
    latencies: list[float]  # answered 200
    timeouts: int
    errors: int
    statuses: dict[str, int]  # answers other than 200
    stopped_early: bool
    seconds: float

    def percentile(self, q: float) -> float:
        """Over every attempt; a timeout or a failed attempt counts as infinite."""
        lost = self.timeouts + self.errors + sum(self.statuses.values())
        return pct(self.latencies + [math.inf] * lost, q)

    def summary(self) -> dict[str, Any]:
        p50, p99 = self.percentile(0.5), self.percentile(0.99)
        return {"attempts": len(self.latencies) + self.timeouts + self.errors
                + sum(self.statuses.values()), "answered": len(self.latencies),
                "timeouts": self.timeouts, "errors": self.errors, "statuses": self.statuses,
                "stopped_early": self.stopped_early, "seconds": self.seconds,
                "p50_s": None if math.isinf(p50) else p50,
                "p99_s": None if math.isinf(p99) else p99,
                "answered_p50_s": pct(self.latencies, 0.5) if self.latencies else None,
                "answered_p99_s": pct(self.latencies, 0.99) if self.latencies else None,
                "latencies_s": self.latencies}


class Probe:
    """The measured requests: one blocking keep-alive connection from 127.0.0.1."""

    def __init__(self, port: int, key: str, model: str, text: str, timeout: float) -> None:
        self.port, self.timeout = port, timeout
        self.body = json.dumps({"model": model, "input": text})
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def one(self) -> tuple[str, float]:
        """("200", latency), (another status, latency), ("timeout", t) or ("error", t)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
        t0 = time.perf_counter()
        try:
            self.conn.request("POST", "/v1/embeddings", self.body, self.headers)
            resp = self.conn.getresponse()
            resp.read()
        except TimeoutError:
            self.close()
            return "timeout", time.perf_counter() - t0
        except (OSError, http.client.HTTPException):
            self.close()
            return "error", time.perf_counter() - t0
        dt = time.perf_counter() - t0
        if resp.will_close:
            self.close()
        return str(resp.status), dt

    def measure(self, k: int, warmup: int, max_timeouts: int, max_s: float) -> Measured:
        self.close()  # a fresh connection per row
        for _ in range(warmup):
            if self.one()[0] in ("timeout", "error"):
                break
        lat: list[float] = []
        statuses: Counter[str] = Counter()
        timeouts = errors = 0
        t0 = time.perf_counter()
        early = False
        for _ in range(k):
            if timeouts >= max_timeouts or time.perf_counter() - t0 > max_s:
                early = True
                break
            status, dt = self.one()
            if status == "200":
                lat.append(dt)
            elif status == "timeout":
                timeouts += 1
            elif status == "error":
                errors += 1
                time.sleep(0.1)
            else:
                statuses[status] += 1
        return Measured(lat, timeouts, errors, dict(statuses), early, time.perf_counter() - t0)


def api_processes(stack: Any) -> list[Any]:
    """The API's worker processes: the children of the gunicorn master (the master
    itself when it has none)."""
    import psutil

    master = psutil.Process(stack.procs["api"].pid)
    return master.children(recursive=True) or [master]


def api_usage(stack: Any) -> dict[str, Any]:
    import psutil

    rss = threads = fds = 0
    pids = []
    for p in api_processes(stack):
        with contextlib.suppress(psutil.Error):
            with p.oneshot():
                rss += p.memory_info().rss
                threads += p.num_threads()
                fds += p.num_fds()
                pids.append(p.pid)
    return {"rss_mib": rss / 2**20, "threads": threads, "fds": fds, "pids": pids}


def api_peers(stack: Any, addrs: set[str]) -> dict[str, int]:
    """The API's TCP sockets whose peer is a load address, by state (its own count of
    the load's connections)."""
    import psutil

    states: Counter[str] = Counter()
    for p in api_processes(stack):
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="tcp4"):
                if c.raddr and c.raddr.ip in addrs:
                    states[c.status] += 1
    return dict(states)


def healthy(port: int, timeout: float = 2.0) -> bool:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def settle(stack: Any, port: int, addrs: set[str], limit_s: float) -> tuple[float, bool]:
    """Wait until the API has closed every load connection and /healthz answers;
    (seconds waited, whether it settled)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if not api_peers(stack, addrs) and healthy(port):
            return time.monotonic() - t0, True
        time.sleep(0.5)
    return time.monotonic() - t0, False


def wait_ramp(held: Held, kind: str, n: int, limit_s: float, stable_s: float = 3.0
              ) -> tuple[dict[str, Any], float, bool]:
    """Poll the load until every slot is held or has given up (slow: has opened once),
    or nothing has moved for ``stable_s``, or ``limit_s`` passed; (the load's stats,
    seconds, whether every slot got there)."""
    t0 = time.monotonic()
    last: tuple[Any, ...] | None = None
    moved = t0
    while True:
        s = held.stats()
        now = time.monotonic()
        if kind == "slow" and s["started"] == n:
            return s, now - t0, True
        if s["held"] + s["given_up"] == n:
            return s, now - t0, True
        sig = (s["held"], s["waiting"], s["given_up"], s["connecting"], s["started"])
        if sig != last:
            last, moved = sig, now
        elif now - moved >= stable_s:
            return s, now - t0, False
        if now - t0 > limit_s:
            return s, now - t0, False
        time.sleep(0.25)


def run_row(stack: Any, probe: Probe, spec: LoadSpec, args: argparse.Namespace
            ) -> dict[str, Any]:
    held = Held(spec)
    samples: list[dict[str, Any]] = []
    try:
        ramp, ramp_s, complete = wait_ramp(held, spec.kind, spec.n, args.ramp_s)
        if spec.kind == "slow":  # all open, the first of them already past a header timeout
            time.sleep(args.slow_hold_s)
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    samples.append({"load": held.stats(), "api": api_usage(stack)})
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        measured = probe.measure(args.requests, args.warmup, args.max_timeouts, args.measure_s)
        stop.set()
        sampler.join(10)
        end = held.stats()
        usage = api_usage(stack)
        peers = api_peers(stack, set(spec.addrs))
        samples.append({"load": end, "api": usage})
    finally:
        final = held.stop()
    probe.close()
    settle_s, settled = settle(stack, spec.port, set(spec.addrs), args.settle_s)
    loads = [x["load"] for x in samples]
    apis = [x["api"] for x in samples]
    return {"kind": spec.kind, "n": spec.n, "ramp_s": ramp_s, "ramp_complete": complete,
            "at_ramp": ramp, "held_min": min(x["held"] for x in loads),
            "held_end": end["held"], "waiting_max": max(x["waiting"] for x in loads),
            "load_end": final or end, "rss_mib_max": max(x["rss_mib"] for x in apis),
            "threads_max": max(x["threads"] for x in apis),
            "fds_max": max(x["fds"] for x in apis), "api_end": usage,
            "api_peers_end": peers,
            "measured": measured.summary(), "settle_s": settle_s, "settled": settled}


# Setting up: the stack, projects, batches ------------------------------------------------


def gthread_command(host: str, port: int, keepalive_s: int) -> list[str]:
    """gunicorn's threaded worker, 64 threads: the API's server before the gevent edge."""
    return [sys.executable, "-m", "gunicorn", "-b", f"{host}:{port}", "-k", "gthread",
            "--threads", "64", "-w", "1", "--graceful-timeout", "10",
            "--keep-alive", str(keepalive_s), "--limit-request-line", "0",
            "--limit-request-field_size", "0", "--limit-request-fields", "32768",
            "--access-logfile", "-", "--log-level", "warning", "api.wsgi:app"]


def call(port: int, key: str, method: str, path: str, body: Any = None,
         raw: bytes | None = None, content_type: str = "application/json") -> Any:
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        headers = {"Authorization": f"Bearer {key}"}
        if data is not None:
            headers["Content-Type"] = content_type
        conn.request(method, path, data, headers)
        resp = conn.getresponse()
        out = resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {out[:300]!r}")
        return json.loads(out) if out else None
    finally:
        conn.close()


def upload(port: int, key: str, name: str, content: bytes) -> str:
    boundary = "edge-" + os.urandom(8).hex()
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
            f"batch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{name}\"\r\nContent-Type: application/jsonl\r\n\r\n").encode()
    body += content + f"\r\n--{boundary}--\r\n".encode()
    out = call(port, key, "POST", "/v1/files", raw=body,
               content_type=f"multipart/form-data; boundary={boundary}")
    return str(out["id"])


@dataclass
class Project:
    id: str
    key: str
    batch_ids: list[str]


def make_projects(port: int, admin_key: str, count: int, batches: int, model: str,
                  rows: int) -> list[Project]:
    """Projects with a key each (Admin API) and ``batches`` embeddings batches each,
    which no worker takes (the stack's model worker serves the realtime lane only)."""
    out = []
    for i in range(count):
        p = call(port, admin_key, "POST", "/v1/organization/projects", {"name": f"edge-{i}"})
        sa = call(port, admin_key, "POST",
                  f"/v1/organization/projects/{p['id']}/service_accounts", {"name": "edge"})
        key = sa["api_key"]["value"]
        lines = "".join(json.dumps({"custom_id": f"r{j}", "method": "POST",
                                    "url": "/v1/embeddings",
                                    "body": {"model": model, "input": f"{TEXT} {j}"}}) + "\n"
                        for j in range(rows))
        fid = upload(port, key, f"edge-{i}.jsonl", lines.encode())
        ids = [call(port, key, "POST", "/v1/batches", {"input_file_id": fid,
                                                        "endpoint": "/v1/embeddings",
                                                        "completion_window": "24h"})["id"]
               for _ in range(batches)]
        out.append(Project(p["id"], key, ids))
    return out


def followed(projects: list[Project]) -> list[tuple[str, str]]:
    """(key, batch id) of every followed batch, the projects taking turns."""
    return [(p.key, p.batch_ids[j]) for j in range(len(projects[0].batch_ids))
            for p in projects]


def batch_statuses(port: int, projects: list[Project]) -> dict[str, str]:
    return {bid: call(port, key, "GET", f"/v1/batches/{bid}")["status"]
            for key, bid in followed(projects)}


def wait_in_progress(port: int, projects: list[Project], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = batch_statuses(port, projects)
        bad = {b: s for b, s in st.items() if s not in ("validating", "in_progress")}
        if bad:
            raise RuntimeError(f"followed batches ended before the run: {bad}")
        if all(s == "in_progress" for s in st.values()):
            return
        time.sleep(0.5)
    raise RuntimeError("followed batches did not reach in_progress")


def source_addresses(count: int) -> list[str]:
    """127.0.0.2, 127.0.0.3, ...: loopback addresses other than the measured client's."""
    if count > 250 * 256:
        raise ValueError("too many source addresses")
    return [f"127.0.{(i + 2) // 256}.{(i + 2) % 256}" for i in range(count)]


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "") if sha else "unknown"


def ms(x: float | None) -> str:
    return "∞" if x is None else f"{x * 1000:.1f}"


@contextlib.contextmanager
def started(args: argparse.Namespace, tmp: str) -> Iterator[Any]:
    from cli.stack import Stack
    from jobs.core.settings import Settings

    st = Settings(data_dir=Path(tmp), api_port=free_port(), worker_heartbeat_s=1,
                  chat_model="", torch_threads=args.torch_threads)
    if st.api_host != HOST:
        raise RuntimeError("the benchmark runs against 127.0.0.1 only")
    stack = Stack(st, model_workers=0)
    try:
        if args.server == "gthread":
            stack.start(api=False)
            stack.spawn("api", gthread_command(st.api_host, stack.port, st.api_keepalive_s))
            stack.wait_healthy(need_workers=False)
        else:
            stack.start()  # the API as the stack runs it
        stack.start_model_worker("rt", "realtime")
        stack.wait_healthy()
        yield stack
    finally:
        stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="100,1000,10000", help="connections held, comma-separated")
    ap.add_argument("--kinds", default=",".join(KINDS), help="load kinds: idle,slow,sse")
    ap.add_argument("--requests", type=int, default=300, help="measured requests per row")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=10.0, help="a measured request's limit")
    ap.add_argument("--max-timeouts", type=int, default=5,
                    help="a row's measurement stops after this many timeouts")
    ap.add_argument("--measure-s", type=float, default=120.0,
                    help="a row's measurement stops after this long")
    ap.add_argument("--ramp-s", type=float, default=180.0, help="at most this to open the load")
    ap.add_argument("--slow-hold-s", type=float, default=2.0,
                    help="slow clients: held this long after all are open, before measuring")
    ap.add_argument("--settle-s", type=float, default=60.0, help="at most this between rows")
    ap.add_argument("--per-address", type=int, default=500,
                    help="load connections per source address")
    ap.add_argument("--projects", type=int, default=3, help="projects the followers spread over")
    ap.add_argument("--batches", type=int, default=1, help="followed batches per project")
    ap.add_argument("--batch-rows", type=int, default=1000, help="rows of each followed batch")
    ap.add_argument("--connect-cap", type=int, default=256,
                    help="load connections being opened at once")
    ap.add_argument("--retry-s", type=float, default=1.0)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--server", choices=("stack", "gthread"), default="stack",
                    help="stack: the API as cli.stack starts it; gthread: gunicorn's threaded "
                         "worker with 64 threads, for comparison")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",") if x.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not ns or any(n < 1 for n in ns) or any(k not in KINDS for k in kinds):
        ap.error(f"--n takes positive counts, --kinds some of {','.join(KINDS)}")
    if min(args.projects, args.batches, args.batch_rows, args.requests, args.per_address) < 1:
        ap.error("--projects, --batches, --batch-rows, --requests and --per-address must be "
                 "at least 1")
    fd_limit = raise_fd_limit()  # the stack's children inherit it
    if max(ns) + FD_MARGIN > fd_limit:
        ap.error(f"N={max(ns)} needs more open descriptors than the limit ({fd_limit})")

    rows: list[dict[str, Any]] = []
    idles: list[dict[str, Any]] = []  # idle measurements: before each row, and at the end
    with tempfile.TemporaryDirectory() as tmp, started(args, tmp) as stack:
        st = stack.settings
        port = stack.port
        per_client = int(getattr(st, "api_max_connections_per_client", 1000))
        per_address = max(1, min(args.per_address, per_client))
        per_project = int(getattr(st, "api_max_streams_per_project", 5000))
        n_projects = max(args.projects, -(-max(ns) // per_project))
        header_timeout = float(getattr(st, "api_header_timeout_s", 20.0))
        model = st.embedding_model
        ids = [m["id"] for m in call(port, stack.api_key, "GET", "/v1/models")["data"]]
        if model not in ids:
            raise RuntimeError(f"the stack serves no {model!r} (it lists {ids})")
        projects = make_projects(port, stack.admin_key, n_projects, args.batches, model,
                                 args.batch_rows)
        wait_in_progress(port, projects)
        addrs = source_addresses(-(-max(ns) // per_address))
        probe = Probe(port, stack.api_key, model, args.text, args.timeout)
        probe.measure(args.warmup, 0, args.max_timeouts, args.measure_s)  # the model's first

        def idle() -> dict[str, Any]:
            m = probe.measure(args.requests, args.warmup, args.max_timeouts, args.measure_s)
            probe.close()
            out = {**m.summary(), "api": api_usage(stack)}
            idles.append(out)
            return out

        requests = {
            "idle": [f"GET /healthz HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()],
            "slow": [f"GET /healthz HTTP/1.1\r\nHost: {HOST}:{port}\r\n".encode()],
            "sse": [(f"GET /v1/batches/{bid}/events HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                     f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n"
                     ).encode() for key, bid in followed(projects)],
        }
        row_limit = (args.ramp_s + header_timeout + args.slow_hold_s
                     + args.warmup * args.timeout + args.measure_s
                     + args.max_timeouts * args.timeout + 120)
        for n in ns:
            for kind in kinds:
                before = idle()
                spec = LoadSpec(kind=kind, n=n, port=port, addrs=addrs, per_address=per_address,
                                requests=requests[kind], retry_s=args.retry_s, drip_s=1.0,
                                connect_cap=args.connect_cap, deadline_s=row_limit,
                                # slow clients open over one header timeout: their 408s
                                # and reconnects come evenly, not in waves
                                spread_s=header_timeout if kind == "slow" else 0.0)
                print(f"{kind} × {n} ...", flush=True)
                row = {**run_row(stack, probe, spec, args), "idle_before": before}
                rows.append(row)
                m = row["measured"]
                print(f"  held {row['held_min']} (ramp {row['ramp_s']:.1f} s), p50 "
                      f"{ms(m['p50_s'])} ms, p99 {ms(m['p99_s'])} ms, timeouts "
                      f"{m['timeouts']}; idle before: p99 {ms(before['p99_s'])} ms; settled "
                      f"in {row['settle_s']:.1f} s", flush=True)
        idle()
        ended = batch_statuses(port, projects)

    def median(key: str) -> float | None:
        xs = [x[key] for x in idles]
        return None if any(x is None for x in xs) else statistics.median(xs)

    columns = ["load", "N", "held", "waiting", "408", "429", "503", "other", "timeouts",
               "p50 ms", "p99 ms", "idle p99", "÷ idle", "RSS MiB", "threads", "API conns"]
    first = idles[0]["api"]
    table: list[list[Any]] = [
        ["none", 0, "", "", "", "", "", "",
         sum(x["timeouts"] for x in idles), ms(median("p50_s")), ms(median("p99_s")), "", "",
         f"{first['rss_mib']:.0f}", first["threads"], ""]]
    for r in rows:
        m, end, before = r["measured"], r["load_end"], r["idle_before"]
        statuses = Counter(end.get("statuses", {}))
        other = sum(v for k, v in statuses.items() if k not in ("408", "429", "503"))
        other += end.get("closed_by_server", 0) + sum(end.get("connect_errors", {}).values())
        r["p99_ratio"] = (None if m["p99_s"] is None or not before["p99_s"]
                          else m["p99_s"] / before["p99_s"])
        table.append([r["kind"], r["n"], r["held_min"], r["waiting_max"], statuses["408"],
                      statuses["429"], statuses["503"], other, m["timeouts"],
                      ms(m["p50_s"]), ms(m["p99_s"]), ms(before["p99_s"]),
                      "∞" if r["p99_ratio"] is None else f"{r['p99_ratio']:.2f}",
                      f"{r['rss_mib_max']:.0f}", r["threads_max"],
                      sum(r["api_peers_end"].values())])
    if any(s not in ("validating", "in_progress") for s in ended.values()):
        print(f"warning: a followed batch ended during the run: {ended}")
    report("edge", f"POST /v1/embeddings latency ({args.requests} sequential on one "
           f"connection) while the API ({args.server}) holds N connections of one kind, ÷ "
           f"the same measured just before on the idle API (first row: median of "
           f"{len(idles)} idle runs); held: least seen while measuring; a request over "
           f"{args.timeout:g} s is a timeout (∞)", columns, table,
           {"commit": git_commit(), "server": args.server, "model": model,
            "idle": idles, "idle_p50_s": median("p50_s"), "idle_p99_s": median("p99_s"),
            "rows": rows, "source_addresses": len(addrs), "per_address": per_address,
            "projects": [p.id for p in projects], "batch_status_at_end": ended,
            "limits": {k: getattr(st, k, None) for k in (
                "api_max_connections", "api_max_connections_per_client",
                "api_max_streams_per_project", "api_header_timeout_s", "api_keepalive_s",
                "events_poll_s", "events_keepalive_s", "events_max_s")},
            "fd_limit": fd_limit, "args": vars(args)})


if __name__ == "__main__":
    main()
