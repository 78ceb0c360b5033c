"""Realtime fairness between projects: project B's small chats' time to first token,
idle and while project A floods the realtime lane with large requests, in one run.

Workload: B sends ``--requests`` streaming chats one after another (greedy, max_tokens
4, a pause of ``--gap`` s between them) with the lane idle, then the same number while
A keeps ``--floods`` streams open, each of ``n`` choices x ``max_tokens`` reserving the
whole cap (INFERQ_DEFAULT_MAX_TOKENS_PER_REALTIME_REQUEST; n 64 x max_tokens 2048 by
default: more sequences than the engine has rows; ``--max-tokens`` to choose), a new
one started as one ends; a flood that does not start ends the run with its errors. The
ratio loaded p99 / idle p99 is the result (goal <= 2); a chat of B's that fails (504)
counts as infinitely late. Worker counters (rows given up to another project, engine
step times) come from its heartbeat (INFERQ_WORKER_HEARTBEAT_S=1). ``--engine``: the
engine the chat model runs on.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, report

MODEL = "SmolLM2-135M-Instruct"
CONTEXT = 8192  # its context window: a choice's max_tokens beyond it is refused


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def failed(xs: list[float]) -> int:
    return sum(not math.isfinite(x) for x in xs)


def worker_stats(r: Any) -> dict[str, Any]:
    for key in r.scan_iter(match="inferq:workers:*"):
        info = json.loads(r.get(key) or "{}")
        if "generation" in info.get("stats", {}):
            return dict(info["stats"]["generation"])
    return {}


def ttft(client: Any, i: int) -> float:
    """One small streaming chat: seconds to its first content token; infinite when it
    failed (a 504: no row for it within the first-token timeout) or answered none."""
    from openai import APIError

    t0 = time.perf_counter()
    first = math.inf
    try:
        stream = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=4, stream=True,
            messages=[{"role": "user", "content": f"Say hello to person {i}."}])
        for c in stream:
            if first == math.inf and c.choices and c.choices[0].delta.content:
                first = time.perf_counter() - t0
    except APIError as e:
        print(f"a small chat failed: {e!r}")
    return first


def small_chats(client: Any, count: int, gap: float, offset: int) -> list[float]:
    out = []
    for i in range(count):
        out.append(ttft(client, offset + i))
        time.sleep(gap)
    return out


class Flood:
    """Project A's large streams, ``streams`` at a time, each restarted as it ends;
    counts the chunks received (A making progress) and the streams that failed."""

    def __init__(self, client: Any, streams: int, n: int, max_tokens: int) -> None:
        self.client, self.n, self.max_tokens = client, n, max_tokens
        self.stop = threading.Event()
        self.chunks = self.started = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(streams)]

    def run(self) -> None:
        while not self.stop.is_set():
            self.started += 1
            try:
                stream = self.client.chat.completions.create(
                    model=MODEL, n=self.n, max_tokens=self.max_tokens, temperature=1.0,
                    stream=True, messages=[{"role": "user", "content":
                                            "Write a very long story about the sea."}])
                for _ in stream:
                    self.chunks += 1
                    if self.stop.is_set():
                        break
                stream.close()
            except Exception as e:  # noqa: BLE001 - reported
                self.errors.append(repr(e))
                time.sleep(1)

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 300
        while self.chunks < 100 and time.monotonic() < deadline:  # A's rows are decoding
            time.sleep(0.2)
        if self.chunks < 100:  # B's chats beside no flood would measure nothing
            self.__exit__()
            raise RuntimeError(f"the flood did not start: {self.errors[:3]}")
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100, help="B's chats per phase")
    ap.add_argument("--gap", type=float, default=0.2, help="pause between B's chats (s)")
    ap.add_argument("--floods", type=int, default=2, help="A's concurrent large streams")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="each of A's choices' (default: the cap / n, within the context)")
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    args = ap.parse_args()

    import redis
    from openai import OpenAI

    from cli.stack import Stack
    from jobs.core.context import Context
    from jobs.core.settings import Settings
    from jobs.tenants import auth

    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port(), worker_heartbeat_s=1,
                      auto_engine=args.engine)
        cap = st.default_max_tokens_per_realtime_request
        max_tokens = args.max_tokens or min(cap // args.n, CONTEXT - 64)  # (64: its prompt)
        with Stack(st) as stack:
            ctx = Context(stack.settings)
            b_key = auth.create_tenant(ctx, "bench-small")[1]
            ctx.close()
            a = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key,
                       max_retries=0, timeout=900)
            b = OpenAI(base_url=stack.base_url + "/v1", api_key=b_key, max_retries=0,
                       timeout=900)
            r = redis.Redis.from_url(stack.settings.redis_url)
            small_chats(b, 5, 0.1, 10_000)  # warm-up: the model loaded
            idle = small_chats(b, args.requests, args.gap, 0)
            with Flood(a, args.floods, args.n, max_tokens) as flood:
                c0 = flood.chunks
                t0 = time.perf_counter()
                loaded = small_chats(b, args.requests, args.gap, args.requests)
                a_rate = (flood.chunks - c0) / (time.perf_counter() - t0)
                stats = worker_stats(r)
            time.sleep(2)
            stats = worker_stats(r) or stats
    ratio = pct(loaded, .99) / pct(idle, .99)
    rows_out: list[list[Any]] = [
        ["B alone (idle lane)", len(idle), f"{pct(idle, .5):.3f}", f"{pct(idle, .99):.3f}"],
        [f"B while A floods ({args.floods} x n {args.n} x max_tokens {max_tokens})",
         len(loaded), f"{pct(loaded, .5):.3f}", f"{pct(loaded, .99):.3f}"],
        ["ratio loaded p99 / idle p99 (goal <= 2)", "", "", f"{ratio:.2f}"],
        ["B's chats failed (idle, loaded)", f"{failed(idle)}, {failed(loaded)}", "", ""],
    ]
    report(f"realtime_fairness_{args.engine}",
           f"{args.engine} engine: project B's time to first token (s), max_tokens 4 "
           f"streaming chats one after another; project A's streams reserve the cap "
           f"({cap} tokens) each; A received {a_rate:.0f} chunks/s meanwhile, "
           f"{flood.started} streams started, {len(flood.errors)} failed; engine step p99 "
           f"{stats.get('recent_step_p99_s', 0) * 1000:.0f} ms; rows given up to B: "
           f"{stats.get('yielded', 'n/a')}",
           ["B's chats", "requests", "TTFT p50", "TTFT p99"], rows_out,
           {"idle_ttft": idle, "loaded_ttft": loaded, "ratio_p99": ratio,
            "meets_goal": ratio <= 2, "a_chunks_per_s": a_rate, "a_streams": flood.started,
            "a_errors": flood.errors[:5], "cap": cap, "step": stats, "args": vars(args)})


if __name__ == "__main__":
    main()
