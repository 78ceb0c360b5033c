"""Admission control of the realtime lane at twice its capacity, with and without it, in
one run.

One stack (embedded backends), one model worker on the realtime lane, and two API
processes on the same Redis and worker: one with the time-to-first-token objective
(INFERQ_REALTIME_TTFT_SLO_S=--slo at p99), one without (every request queued).
1. capacity: a closed loop of --concurrency clients sending the fixed request for
   --capacity-window s; answered requests per second = the lane's capacity (the
   worker measures its service rate meanwhile, the admission model's input);
2. with admission: Poisson arrivals at --load × capacity for --window s; once the
   requests in the system are answered,
3. without admission: the same arrival sequence (seed 0) for --window s (second: its
   backlog grows for the whole window and its huge passes would otherwise be the
   service rate the guarded phase starts from).
The workers measure μ over the last 10 s (INFERQ_ADMISSION_SERVICE_WINDOW_S).
Each request: POST /v1/embeddings of one fixed text (~100 tokens); its time to first
token is its latency (the whole answer is its first token), measured from its
scheduled arrival, so client-side queueing counts. Reported per arrangement: requests,
answered, refused (503 overloaded), p50/p99 latency of the answered, goodput (answers
within the objective per second of the window). Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import Poster, free_port, poisson_arrivals, report

MODEL = "all-MiniLM-L6-v2"
TEXT = ("Queueing theory describes how requests wait for servers: arrivals come at random, "
        "each server takes some time per request, and when work arrives faster than it can "
        "be served the queue grows without bound. A latency objective is kept by refusing "
        "the requests that would miss it anyway, so that those admitted are answered in "
        "time and the servers stay busy with useful work.")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


class Caller(Poster):
    """POST /v1/embeddings of one fixed text."""

    def __init__(self, port: int, key: str, text: str = TEXT) -> None:
        super().__init__(port, key)
        self.body = json.dumps({"model": MODEL, "input": text, "encoding_format": "float"})

    def __call__(self) -> int:
        return self.post("/v1/embeddings", self.body)[0]


def closed_loop(call: Callable[[], int], concurrency: int, seconds: float) -> float:
    done = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def loop() -> None:
        while time.perf_counter() < stop:
            if call() == 200:
                with lock:
                    done[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / (time.perf_counter() - t0)


def open_loop(call: Caller, rate: float, window: float, seed: int) -> list[tuple[int, float]]:
    """Poisson arrivals at ``rate`` for ``window`` s: (status, latency from arrival)."""
    rng = random.Random(seed)
    out: list[tuple[int, float]] = []
    lock = threading.Lock()

    def one(at: float) -> None:
        try:
            status = call()
        except (OSError, http.client.HTTPException):
            status = 0
        with lock:
            out.append((status, time.perf_counter() - at))

    with ThreadPoolExecutor(512) as pool:
        for due in poisson_arrivals(rng, rate, window):
            pool.submit(one, due)
    return out


def summary(name: str, got: list[tuple[int, float]], slo: float, window: float
            ) -> dict[str, Any]:
    ok = [lat for s, lat in got if s == 200]
    refused = sum(1 for s, _ in got if s == 503)
    return {"arrangement": name, "requests": len(got), "answered": len(ok),
            "refused": refused, "failed": len(got) - len(ok) - refused,
            "refused_share": refused / max(len(got), 1),
            "p50_s": pct(ok, 0.5), "p99_s": pct(ok, 0.99),
            "goodput_per_s": sum(1 for x in ok if x <= slo) / window}


def drained(r: Any, timeout: float = 120) -> None:
    from jobs.slo import admission

    deadline = time.monotonic() + timeout
    while admission.lane_state(r, MODEL, 10).in_system > 0 and time.monotonic() < deadline:
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slo", type=float, default=1.0, help="p99 time-to-first-token objective")
    ap.add_argument("--load", type=float, default=2.0, help="offered load ÷ capacity")
    ap.add_argument("--window", type=float, default=20)
    ap.add_argument("--capacity-window", type=float, default=12)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args()

    import redis

    from cli.command_lines import api_command
    from cli.stack import Stack
    from jobs.core.settings import Settings
    from jobs.fleet.heartbeats import live_workers

    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port(), worker_heartbeat_s=1,
                      realtime_ttft_slo_s=args.slo, realtime_slo_percentile=0.99,
                      torch_threads=args.torch_threads, chat_model="",
                      admission_service_window_s=10)
        stack = Stack(st, model_workers=0)
        try:
            stack.start()
            stack.start_model_worker("rt", "realtime")
            plain_port = free_port()
            stack.spawn("api-plain", api_command(st.api_host, plain_port,
                                                 st.api_max_connections, st.api_keepalive_s),
                        INFERQ_API_PORT=str(plain_port), INFERQ_REALTIME_TTFT_SLO_S="0")
            stack.wait_healthy()
            r = redis.Redis.from_url(stack.settings.redis_url)
            guarded = Caller(stack.port, stack.api_key)
            plain = Caller(plain_port, stack.api_key)
            closed_loop(plain, 4, 3)  # warm-up: both APIs, the worker's first passes
            closed_loop(guarded, 4, 2)
            capacity = closed_loop(plain, args.concurrency, args.capacity_window)
            rate = args.load * capacity
            service = [h.get("service", {}).get(MODEL)
                       for h in live_workers(r, "realtime", MODEL)]
            with_adm = open_loop(guarded, rate, args.window, seed=0)
            drained(r)
            without = open_loop(plain, rate, args.window, seed=0)
            drained(r)
        finally:
            stack.stop()
    rows = [summary("without admission control", without, args.slo, args.window),
            summary("with admission control", with_adm, args.slo, args.window)]
    table = [[x["arrangement"], x["requests"], x["answered"], x["refused"], x["failed"],
              f"{x['refused_share']:.0%}", f"{x['p50_s']:.3f}", f"{x['p99_s']:.3f}",
              f"{x['goodput_per_s']:.1f}"] for x in rows]
    ratio = rows[1]["goodput_per_s"] / max(rows[0]["goodput_per_s"], 1e-9)
    report("admission", f"realtime embeddings at {args.load:g}× the measured capacity "
           f"({capacity:.1f}/s → {rate:.1f}/s offered, Poisson, {args.window:g} s); objective "
           f"p99 TTFT ≤ {args.slo:g} s; goodput with ÷ without {ratio:.2f}",
           ["arrangement", "requests", "answered", "refused", "failed", "refused %",
            "TTFT p50 s", "TTFT p99 s", "goodput /s"], table,
           {"capacity_per_s": capacity, "offered_per_s": rate, "rows": rows,
            "goodput_ratio": ratio, "worker_service": service,
            "meets_goal": rows[1]["p99_s"] <= args.slo, "args": vars(args)})


if __name__ == "__main__":
    main()
