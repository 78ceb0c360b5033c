"""Three models on two workers with room for two each, a skewed stream of realtime
requests: residency-aware routing with warm pools against load-on-demand by whichever
worker takes the request, in one run.

Each arrangement runs on a stack of its own (embedded backends, API, control worker)
with two model workers on the simulated accelerator (--profile; a model load costs
the profile's ``load_s`` plus its bytes at ``load_mb_per_s``), each allowed two model
versions (INFERQ_MODEL_MEMORY_MB = 2.5 x a model's size). The three models are names
for the packaged all-MiniLM-L6-v2's files; worker 0 starts holding m1, worker 1 m2.

- residency (INFERQ_PLACEMENT=residency): requests go to their version's queue, which
  only its holders consume; warm pools keep m1 (the hot model) on both workers and m2
  and m3 on one each (4 copies in 4 slots), loaded before the window;
- on demand (INFERQ_PLACEMENT=on_demand): one queue for every request; the worker that
  takes a request for a model it does not hold loads it there and then, evicting its
  least recently used model.

The same arrival sequence (Poisson at each --rates rate per second for --window s, seed 0) is
sent to both: each request names m1, m2 or m3 with probabilities --mix, and the mix
turns over halfway (m3 becomes the hot one, m1 the cold one). An embeddings request's
time to first token is its latency, measured from its scheduled arrival. Cold starts
are the model loads in the window (the workers' counters, Redis ``inferq:model-loads``).
Each --rates rate is run on its own; arrangements alternate for --rounds rounds. Traffic
goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import Poster, free_port, report, spread

MODELS = ("m1", "m2", "m3")
TEXT = "A request for one of several models, served where that model is resident."


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


class Caller(Poster):
    """POST /v1/embeddings of the fixed text for one of the models."""

    def __call__(self, model: str) -> tuple[int, bytes]:
        return self.post("/v1/embeddings", json.dumps(
            {"model": model, "input": TEXT, "encoding_format": "float"}))


def schedule(args: argparse.Namespace) -> list[tuple[float, str]]:
    """(offset in the window, model) of every arrival: the same for both arrangements."""
    rng = random.Random(0)
    out, at = [], 0.0
    first = [float(x) for x in args.mix.split(",")]
    second = list(reversed(first))
    while True:
        at += rng.expovariate(args.rate)
        if at > args.window:
            return out
        mix = first if at < args.window / 2 else second
        out.append((at, rng.choices(MODELS, weights=mix)[0]))


def total_loads(r: Any, reasons: tuple[str, ...]) -> int:
    from jobs.fleet import placement

    return sum(n for by in placement.load_counts(r).values() for why, n in by.items()
               if why in reasons)


def run(policy: str, args: argparse.Namespace, arrivals: list[tuple[float, str]]
        ) -> dict[str, Any]:
    import redis

    from cli.stack import Stack
    from jobs.core.context import Context
    from jobs.core.settings import Settings
    from jobs.fleet import placement, registry
    from jobs.fleet.heartbeats import live_workers

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        st = Settings(data_dir=tmp / "data", api_port=free_port(), chat_model="",
                      accelerator="simulated", simulated_profile=args.profile,
                      placement=policy, janitor_interval_s=1.0)
        stack = Stack(st, model_workers=0)
        try:
            stack.start(api=True, workers=True)
            ctx = Context(stack.settings)
            base = registry.get_default(ctx, "all-MiniLM-L6-v2")
            assert base is not None
            for m in MODELS:
                registry.register(ctx, m, "1", "embeddings", "bench: all-MiniLM-L6-v2's files",
                                  base.files, base.context_length,
                                  object_prefix=base.object_prefix)
            budget = str(int(registry.total_bytes(base) / (1 << 20) * 2.5))
            for i, m in enumerate(MODELS[:2]):
                stack.start_model_worker(f"w{i}", "realtime", INFERQ_EMBEDDING_MODEL=m,
                                         INFERQ_MODEL_MEMORY_MB=budget,
                                         INFERQ_WORKER_HEARTBEAT_S="1")
            r = redis.Redis.from_url(stack.settings.redis_url)
            deadline = time.monotonic() + 180
            while len(live_workers(r, "realtime")) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError("the workers did not start")
                time.sleep(0.5)
            if policy == "residency":  # warm pools: 4 copies in the 4 slots
                for m, copies in (("m1", 2), ("m2", 1), ("m3", 1)):
                    registry.set_pool(ctx, m, "1", min_resident=copies)
                while sorted(len(v) for k, v in placement.where(r).items()
                             if k in {f"{m}@1" for m in MODELS}) != [1, 1, 2]:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"warm pools not filled: {placement.where(r)}")
                    time.sleep(0.5)
            call = Caller(stack.settings.api_port, stack.api_key)
            for m in MODELS[:2]:  # connections and engines warm, outside the window
                call(m)
            time.sleep(2)
            loads0 = total_loads(r, ("placement", "on_demand", "warm_pool"))
            lat: list[float] = []
            by_model: dict[str, list[float]] = {m: [] for m in MODELS}
            errors: dict[int, int] = {}
            samples: list[str] = []
            lock = threading.Lock()

            def one(due: float, model: str) -> None:
                try:
                    status, body = call(model)
                except Exception as e:  # noqa: BLE001 - counted as an error
                    status, body = 599, repr(e).encode()
                took = time.perf_counter() - due
                with lock:
                    if status == 200:
                        lat.append(took)
                        by_model[model].append(took)
                    else:
                        errors[status] = errors.get(status, 0) + 1
                        if len(samples) < 5:
                            samples.append(body.decode(errors="replace")[:300])

            rate = len(arrivals) / args.window
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                for at, model in arrivals:
                    time.sleep(max(0.0, t0 + at - time.perf_counter()))
                    pool.submit(one, t0 + at, model)
            wall = time.perf_counter() - t0
            time.sleep(2)  # the last heartbeats
            loads = total_loads(r, ("placement", "on_demand", "warm_pool")) - loads0
            r.close()
            ctx.close()
        finally:
            stack.stop()
    return {"policy": policy, "requests": len(arrivals), "answered": len(lat),
            "errors": errors, "offered_rate": rate, "wall_s": wall,
            "p50_s": pct(lat, 0.5), "p99_s": pct(lat, 0.99), "max_s": max(lat, default=0),
            "p99_by_model_s": {m: pct(v, 0.99) for m, v in by_model.items()},
            "cold_starts": loads, "error_samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="5,30", help="arrivals per second, one run each")
    ap.add_argument("--window", type=float, default=40.0, help="seconds of arrivals")
    ap.add_argument("--mix", default="0.6,0.3,0.1",
                    help="shares of m1, m2, m3 (reversed for the second half)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--profile", default="h100-minilm")
    args = ap.parse_args()
    rows, data = [], []
    for rate in (float(x) for x in args.rates.split(",")):
        args.rate = rate
        arrivals = schedule(args)
        results: dict[str, list[dict[str, Any]]] = {"residency": [], "on_demand": []}
        for i in range(args.rounds):
            for policy in (("residency", "on_demand") if i % 2 == 0
                           else ("on_demand", "residency")):
                got = run(policy, args, arrivals)
                results[policy].append(got)
                print(f"{rate:g}/s round {i + 1} {policy}: p99 {got['p99_s']:.3f} s, cold "
                      f"starts {got['cold_starts']}, answered {got['answered']}/"
                      f"{got['requests']}, errors {got['errors']} {got['error_samples'][:2]}")
        ratio = [o["p99_s"] / r["p99_s"] for r, o in zip(results["residency"],
                                                            results["on_demand"], strict=True)]
        for policy, runs in results.items():
            rows.append([f"{rate:g}", policy, runs[0]["requests"],
                         spread([x["p50_s"] for x in runs]),
                         spread([x["p99_s"] for x in runs]),
                         spread([float(x["cold_starts"]) for x in runs]),
                         sum(x["requests"] - x["answered"] for x in runs),
                         "" if policy == "residency" else spread(ratio)])
        data.append({"rate": rate, "results": results, "p99_ratio_per_round": ratio})
    report("placement", f"3 models on 2 workers (room for 2 each), {args.window:g} s of "
           f"arrivals, mix {args.mix} then reversed, profile {args.profile}",
           ["req/s", "arrangement", "requests", "TTFT p50 s", "TTFT p99 s", "cold starts",
            "not answered", "p99 ÷ residency"], rows, {"runs": data, "args": vars(args)})


if __name__ == "__main__":
    main()
