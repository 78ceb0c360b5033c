"""Realtime under load: time to first token of streaming chat requests arriving at a
fixed rate, idle vs while a batch of chat requests saturates the same worker, in one
run; the batch's tokens/s with and without the realtime traffic; and beside it the
naive arrangement, where an interactive request is a one-line batch queued behind
the shards (its first token is available when that batch completes).

Workload: streaming requests "Say something about <topic> number i." (greedy, 16
new tokens) arriving as a Poisson process (rate --rate, seed 0) for --window s; the
batch: --batch chat requests from bench.generation.prompts (32 new tokens each).
Worker counters come from its heartbeat (INFERQ_WORKER_HEARTBEAT_S=1). ``--engine``: the
generation engine the chat model runs on (the worker's INFERQ_AUTO_ENGINE).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, poisson_arrivals, report
from bench.generation import prompts

MODEL = "SmolLM2-135M-Instruct"
BATCH_PRIORITY = "2"



def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def worker_stats(r: Any) -> dict[str, Any]:
    for key in r.scan_iter(match="inferq:workers:*"):
        info = json.loads(r.get(key) or "{}")
        if "generation" in info.get("stats", {}):
            return {"at": info["at"], **info["stats"]["generation"]}
    raise RuntimeError("no worker with a generation engine is reporting")


def batch_tokens(r: Any) -> tuple[float, int]:
    s = worker_stats(r)
    return s["at"], int(s["tokens_by_priority"].get(BATCH_PRIORITY, 0))


def realtime_wave(client: Any, rate: float, window: float, seed: int) -> list[float]:
    """Streams at Poisson arrivals; returns each request's time to first content token."""
    rng = random.Random(seed)
    ttft: list[float] = []
    errors: list[BaseException] = []
    threads = []

    def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            stream = client.chat.completions.create(
                model=MODEL, temperature=0, max_tokens=16, stream=True,
                messages=[{"role": "user", "content": f"Say something about topic {i}."}])
            first = None
            for c in stream:
                if first is None and c.choices and c.choices[0].delta.content:
                    first = time.perf_counter() - t0
            if first is not None:
                ttft.append(first)
        except BaseException as e:  # noqa: BLE001 - reported
            errors.append(e)

    for i, _ in enumerate(poisson_arrivals(rng, rate, window)):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(300)
    if errors:
        raise RuntimeError(f"{len(errors)} realtime requests failed: {errors[0]!r}")
    return ttft


def batch_window(r: Any, seconds: float) -> float:
    t0, n0 = batch_tokens(r)
    time.sleep(seconds)
    t1, n1 = batch_tokens(r)
    return (n1 - n0) / max(t1 - t0, 1e-9)


def submit_batch(client: Any, rows: list[dict[str, Any]], path: Path) -> str:
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    with path.open("rb") as fh:
        f = client.files.create(file=(path.name, fh), purpose="batch")
    return str(client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                     completion_window="24h").id)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=0.5, help="realtime requests per second")
    ap.add_argument("--window", type=float, default=40)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--batch-window", type=float, default=20)
    ap.add_argument("--naive", type=int, default=5)
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    args = ap.parse_args()

    import redis
    from openai import OpenAI

    from cli.stack import Stack
    from jobs.core.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port(), worker_heartbeat_s=1,
                      auto_engine=args.engine)
        with Stack(st) as stack:
            client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key,
                            max_retries=0, timeout=600)
            r = redis.Redis.from_url(stack.settings.redis_url)
            realtime_wave(client, 1.0, 3, seed=99)  # warm-up
            idle = realtime_wave(client, args.rate, args.window, seed=0)
            rows = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": MODEL, "messages": m, "max_tokens": 32,
                              "temperature": 0}}
                    for i, m in enumerate(prompts(args.batch, seed=1))]
            big = submit_batch(client, rows, Path(tmp) / "big.jsonl")
            while batch_tokens(r)[1] == 0:
                time.sleep(0.5)
            only_a = batch_window(r, args.batch_window)
            naive_sent: dict[str, float] = {}
            for i in range(args.naive):
                bid = submit_batch(client, [{**rows[i], "custom_id": f"naive{i}"}],
                                   Path(tmp) / f"naive{i}.jsonl")
                naive_sent[bid] = time.perf_counter()
            t0, n0 = batch_tokens(r)
            loaded = realtime_wave(client, args.rate, args.window, seed=0)
            t1, n1 = batch_tokens(r)
            with_rt = (n1 - n0) / (t1 - t0)
            step = worker_stats(r)
            only_c = batch_window(r, args.batch_window)
            naive: list[float] = []
            pending = dict(naive_sent)
            while pending:
                for bid in list(pending):
                    b = client.batches.retrieve(bid)
                    if b.status in ("completed", "failed", "cancelled", "expired"):
                        naive.append(time.perf_counter() - pending.pop(bid))
                time.sleep(0.5)
            big_status = client.batches.retrieve(big).status
    batch_only = (only_a + only_c) / 2
    step_p99 = step["recent_step_p99_s"]
    goal = pct(idle, 0.99) + step_p99
    rows_out = [
        ["idle (no batch)", len(idle), f"{pct(idle, .5):.3f}", f"{pct(idle, .99):.3f}"],
        ["inferq, batch saturating the worker", len(loaded), f"{pct(loaded, .5):.3f}",
         f"{pct(loaded, .99):.3f}"],
        ["naive: request queued behind shards", len(naive), f"{pct(naive, .5):.1f}",
         f"{pct(naive, .99):.1f}"],
        ["goal: idle p99 + one p99 engine step", "", "", f"{goal:.3f}"],
        ["goal: idle p99 + 0.3 s", "", "", f"{pct(idle, .99) + 0.3:.3f}"],
    ]
    report("realtime", f"{args.engine} engine: time to first token (s), streaming chat at "
           f"{args.rate}/s for "
           f"{args.window:.0f} s; batch of {args.batch} chat requests; engine step p99 "
           f"{step_p99 * 1000:.0f} ms; batch tokens/s {batch_only:.0f} alone, {with_rt:.0f} "
           f"with realtime ({with_rt / batch_only:.0%} retained)",
           ["arrangement", "requests", "TTFT p50", "TTFT p99"], rows_out,
           {"idle_ttft": idle, "loaded_ttft": loaded, "naive_latency": naive,
            "step": step, "batch_tokens_per_s": {"alone_before": only_a, "alone_after": only_c,
                                                 "with_realtime": with_rt},
            "retained": with_rt / batch_only, "goal_p99": goal,
            "meets_goal": pct(loaded, .99) <= goal,
            "within_0_3_s": pct(loaded, .99) <= pct(idle, .99) + 0.3,
            "big_batch_status": big_status,
            "args": vars(args), "p50_idle": statistics.median(idle) if idle else None})


if __name__ == "__main__":
    main()
