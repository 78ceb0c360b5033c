"""The capacity planner's accuracy: predicted (M/G/c) vs measured p99 wait of
realtime requests for 1, 2 and 4 workers (``--workers``) at two loads each.

For each worker count c, a stack (embedded backends) with c model workers on the
realtime lane, each with one torch thread and micro-batches of one row
(INFERQ_MAX_BATCH_ROWS=1: a worker is one server taking one request at a time).
Requests: POST /v1/embeddings of one text from a pool of --texts texts whose lengths
are exponentially distributed (seed 0): the service time varies with the length, less
than an exponential one would (the workers measure its Cs², which M/G/c takes).
1. calibration: each text sent alone, three times, one at a time; its latency
   without waiting is the least of the three (L0: API, Redis and its own pass);
2. capacity: a closed loop of 3c clients for --saturate s; μ_sat per worker from
   the workers' heartbeats;
3. for each load ρ in --loads: Poisson arrivals at λ = ρ·c·μ_sat for --window s, or
   longer where that is fewer than --requests arrivals (a p99 needs enough of them);
   each request's wait is the time it waited for a worker's engine, as its answer says
   (the ``inferq-queue-ms`` header: from the API's push to the start of its pass);
   the prediction is the M/G/c p99 wait (Erlang C with the Allen–Cunneen factor) at
   that λ with μ and Cs² as the workers measured them during the run (their
   heartbeats: the model's input, read from live metrics as `inferq capacity` does),
   the M/M/c one beside it. The client-side wait (latency minus its text's L0: the
   queue plus whatever else a busier API, Redis and machine add) is reported beside.
With ``--accelerator simulated`` the workers run the simulated accelerator
(``--profile``, default cpu1-minilm: one CPU core's cost per padded token) instead of
the model: everything else is the real service, and c workers are c servers even where
c exceeds the machine's cores (four torch workers on two cores are not four servers).
Text lengths are capped at --max-words.
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.admission import MODEL, Caller, closed_loop, pct
from bench.common import free_port, poisson_arrivals, report

WORDS = ("queue server wait arrival rate service latency objective worker model engine "
         "batch token request answer capacity load").split()


def text_pool(n: int, mean_words: float, seed: int, max_words: int = 200) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(1 + min(max_words, int(
        rng.expovariate(1 / mean_words))))) for _ in range(n)]


def measured(r: Any) -> tuple[float, float]:
    """μ and the service times' Cs² over the live workers (weighted by requests measured)."""
    from jobs.fleet.heartbeats import live_workers
    from jobs.slo import service_rates

    view = service_rates.servers_of(live_workers(r, "realtime", MODEL), MODEL)
    return (view.mu or float("nan")), view.scv


def one_config(c: int, args: argparse.Namespace, pool: list[str]) -> list[dict[str, Any]]:
    import redis

    from cli.stack import Stack
    from jobs.core.settings import Settings
    from jobs.fleet.heartbeats import live_workers
    from jobs.slo import admission, queueing

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port(), worker_heartbeat_s=1,
                      torch_threads=1, chat_model="", max_batch_rows=1,
                      admission_service_window_s=args.window,
                      accelerator=args.accelerator, simulated_profile=args.profile)
        stack = Stack(st, model_workers=0)
        try:
            stack.start()
            for i in range(c):
                stack.start_model_worker(f"rt{i}", "realtime")
            r = redis.Redis.from_url(stack.settings.redis_url)
            deadline = time.monotonic() + 300
            while len(live_workers(r, "realtime", MODEL)) < c:
                assert time.monotonic() < deadline, "workers did not start"
                time.sleep(0.5)
            callers = {t: Caller(stack.port, stack.api_key, t) for t in pool}
            closed_loop(callers[pool[0]], 2 * c, 3)  # warm-up
            base = {}
            for t, call in callers.items():
                lat = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    assert call() == 200
                    lat.append(time.perf_counter() - t0)
                base[t] = min(lat)
            rng = random.Random(1)
            mixed = MixedCaller(callers, pool, rng)
            closed_loop(mixed, 3 * c, args.saturate)
            time.sleep(2.5)  # heartbeats carry the saturated rate
            mu_sat, _ = measured(r)
            for rho in args.loads:
                lam = rho * c * mu_sat
                window = max(args.window, args.requests / lam)
                got = open_loop_texts(mixed, lam, window, seed=int(rho * 100))
                ok = [(lat, t, q) for status, lat, t, q in got if status == 200]
                client = [max(0.0, lat - base[t]) for lat, t, _ in ok]
                waits = [q for _, _, q in ok if q is not None]
                assert len(waits) == len(ok), "answers without inferq-queue-ms"
                time.sleep(2.5)
                mu, scv = measured(r)
                predicted = queueing.wait_percentile(0.99, c, lam, mu, scv)
                mmc = queueing.wait_percentile(0.99, c, lam, mu)
                p99 = pct(waits, 0.99)
                out.append({"workers": c, "accelerator": args.accelerator,
                            "rho_offered": rho, "lambda": lam, "mu_sat": mu_sat,
                            "mu_run": mu, "scv": scv, "rho_model": lam / (c * mu),
                            "requests": len(got), "answered": len(waits),
                            "window_s": window, "client_p99_s": pct(client, 0.99),
                            "client_p50_s": pct(client, 0.5),
                            "predicted_p99_s": predicted, "mmc_p99_s": mmc,
                            "measured_p99_s": p99, "measured_p50_s": pct(waits, 0.5),
                            "predicted_p50_s": queueing.wait_percentile(0.5, c, lam, mu, scv),
                            "error": predicted / p99 - 1 if p99 > 0 else None,
                            "mmc_error": mmc / p99 - 1 if p99 > 0 else None,
                            "base_latency_median_s": statistics.median(base.values())})
                while admission.lane_state(r, MODEL, 10).in_system > 0:
                    time.sleep(0.2)
        finally:
            stack.stop()
    return out


def sampled_p99(c: int, lam: float, mu: float, scv: float, n: int, runs: int = 400,
                seed: int = 0) -> tuple[float, float, float]:
    """What a measured p99 of ``n`` requests would be if the lane were exactly the M/G/c
    queue the planner models (Poisson arrivals, gamma service times with mean 1/μ and
    Cs²): the true p99 (from a long run) and the 2.5 % and 97.5 % points of the p99 of
    ``runs`` runs of ``n`` requests each. A measured p99 outside that band is a miss of
    the model; one inside it but more than 25 % from the prediction is the sample's."""
    import heapq

    import numpy as np

    rng = np.random.default_rng(seed)
    k = 1 / max(scv, 1e-3)

    def waits(count: int) -> Any:
        arrivals = np.cumsum(rng.exponential(1 / lam, count))
        service = rng.gamma(k, 1 / (mu * k), count)
        free = [0.0] * c
        out = np.empty(count)
        for i in range(count):
            t, f = arrivals[i], heapq.heappop(free)
            start = t if f < t else f
            out[i] = start - t
            heapq.heappush(free, start + service[i])
        return out

    true = float(np.quantile(waits(200 * n)[10 * n:], 0.99))
    got = [float(np.quantile(waits(n), 0.99)) for _ in range(runs)]
    lo, hi = np.quantile(got, [0.025, 0.975])
    return true, float(lo), float(hi)


class MixedCaller:
    """Each call sends a random text of the pool (one keep-alive connection per thread
    and text); returns the status."""

    def __init__(self, callers: dict[str, Caller], pool: list[str], rng: random.Random
                 ) -> None:
        self.callers, self.pool, self.rng = callers, pool, rng
        self.lock = threading.Lock()

    def pick(self) -> str:
        with self.lock:
            return self.rng.choice(self.pool)

    def __call__(self) -> int:
        return self.callers[self.pick()]()


def open_loop_texts(mixed: MixedCaller, rate: float, window: float, seed: int
                    ) -> list[tuple[int, float, str, float | None]]:
    """Poisson arrivals at ``rate`` for ``window`` s: (status, latency, text, the wait
    for an engine its answer reports in seconds)."""
    rng = random.Random(seed)
    out: list[tuple[int, float, str, float | None]] = []
    lock = threading.Lock()

    def one(at: float, text: str) -> None:
        caller = mixed.callers[text]
        queued = None
        try:
            status = caller()
            if (ms := caller.headers().get("inferq-queue-ms")) is not None:
                queued = float(ms) / 1000
        except OSError:
            status = 0
        with lock:
            out.append((status, time.perf_counter() - at, text, queued))

    with ThreadPoolExecutor(256) as pool:
        for due in poisson_arrivals(rng, rate, window):
            pool.submit(one, due, rng.choice(mixed.pool))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", type=Path, default=None, metavar="JSON",
                    help="report a earlier run's results (its JSON) again; measure nothing")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--loads", type=float, nargs="+", default=[0.5, 0.8])
    ap.add_argument("--window", type=float, default=20)
    ap.add_argument("--requests", type=int, default=0,
                    help="at least this many arrivals per load (the window grows)")
    ap.add_argument("--saturate", type=float, default=8)
    ap.add_argument("--texts", type=int, default=24)
    ap.add_argument("--mean-words", type=float, default=40)
    ap.add_argument("--max-words", type=int, default=200)
    ap.add_argument("--accelerator", choices=["auto", "simulated"], default="auto")
    ap.add_argument("--profile", default="cpu1-minilm", help="simulated accelerator profile")
    args = ap.parse_args()
    if args.report is not None:
        rows = json.loads(args.report.read_text())["rows"]
        args.accelerator, args.profile = rows[0]["accelerator"], args.profile
    else:
        pool = text_pool(args.texts, args.mean_words, seed=0, max_words=args.max_words)
        rows = []
        for c in args.workers:
            rows += one_config(c, args, pool)
    for x in rows:
        x["mgc_p99_s"], x["sample_lo_s"], x["sample_hi_s"] = sampled_p99(
            x["workers"], x["lambda"], x["mu_run"], x["scv"], x["answered"])
        x["in_band"] = x["sample_lo_s"] <= x["measured_p99_s"] <= x["sample_hi_s"]
    def err(e: float | None) -> str:
        return "" if e is None else f"{e:+.0%}"

    table = [[x["workers"], f"{x['rho_offered']:.1f}", f"{x['lambda']:.1f}",
              f"{x['mu_run']:.1f}", f"{x['scv']:.2f}", f"{x['rho_model']:.2f}", x["answered"],
              f"{x['predicted_p50_s'] * 1000:.0f}", f"{x['measured_p50_s'] * 1000:.0f}",
              f"{x['predicted_p99_s'] * 1000:.0f}", f"{x['measured_p99_s'] * 1000:.0f}",
              err(x["error"]), f"{x['mmc_p99_s'] * 1000:.0f}", err(x["mmc_error"]),
             f"{x['mgc_p99_s'] * 1000:.0f}",
             f"{x['sample_lo_s'] * 1000:.0f}–{x['sample_hi_s'] * 1000:.0f}",
             "yes" if x["in_band"] else "no", f"{x['client_p99_s'] * 1000:.0f}"]
             for x in rows]
    in_band = sum(1 for x in rows if x["in_band"])
    within = sum(1 for x in rows if x["error"] is not None and abs(x["error"]) <= 0.25)
    mmc_within = sum(1 for x in rows
                     if x["mmc_error"] is not None and abs(x["mmc_error"]) <= 0.25)
    device = ("the model" if args.accelerator == "auto"
              else f"the simulated accelerator ({args.profile})")
    report(f"planner-{args.accelerator}", f"predicted (M/G/c) vs measured realtime wait, "
           f"workers on {device}; {within} of {len(rows)} "
           f"p99 predictions within 25 % (M/M/c: {mmc_within}); {in_band} measured p99 "
           f"within the 95 % band of an exact M/G/c's at their number of requests",
           ["workers", "ρ offered", "λ /s", "μ /s/worker", "Cs²", "ρ model", "answered",
            "p50 pred ms", "p50 meas ms", "p99 pred ms", "p99 meas ms", "p99 error",
            "M/M/c p99 ms", "M/M/c error", "exact M/G/c p99 ms",
            "its 95 % band at n (ms)", "in band", "client p99 ms"],
           table, {"rows": rows, "within_25pct": within, "mmc_within_25pct": mmc_within,
                   "in_band": in_band,
                   "args": {k: str(v) if isinstance(v, Path) else v
                            for k, v in vars(args).items()}})


if __name__ == "__main__":
    main()
