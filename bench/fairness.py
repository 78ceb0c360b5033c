"""Fair share of the batch lanes: a small batch of project B submitted behind a large
batch of project A, fair dispatch vs FIFO, in the same run.

For each mode a stack runs on one data dir (embedded PostgreSQL and Redis, a file://
store; the models are imported once), one model worker, small shards. Each round,
alternating FIFO and fair stacks:
- alone: A's batch of --large rows by itself; its throughput (rows/s, upload to
  completed output);
- behind: A's batch again, and once its first shard has started, B's batch of
  --small rows; B's completion time (create to completed) and how many of A's
  shards started after B's shards were inserted and before B's last one started
  (from the shards' times in the database).
Ratios: B's completion time FIFO ÷ fair, and A's throughput fair ÷ FIFO (what the
dispatcher keeps of the large batch's throughput; goal >= 0.95).
Workload: bench.workload.texts(--large, seed=0) for A, texts(--small, seed=1) for B.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, report, spread
from bench.workload import texts, write_embeddings_jsonl

DONE = ("completed", "failed", "cancelled", "expired")


def submit(client: Any, path: Path) -> Any:
    with path.open("rb") as fh:
        f = client.files.create(file=(path.name, fh), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                 completion_window="24h")


def finish(client: Any, batch_id: str, n: int) -> float:
    """Wait for the batch, read its output; the time it completed (monotonic)."""
    b = client.batches.retrieve(batch_id)
    while b.status not in DONE:
        time.sleep(0.1)
        b = client.batches.retrieve(batch_id)
    assert b.status == "completed" and b.request_counts.completed == n, b
    t = time.monotonic()
    assert client.files.content(b.output_file_id).read().count(b"\n") == n
    return t


def shard_times(ctx: Any, batch_id: str) -> list[tuple[float | None, float | None]]:
    from sqlalchemy import select

    from jobs.core.schema import Shard

    with ctx.db.session() as s:
        return [(c, k) for c, k in s.execute(
            select(Shard.created_at, Shard.claimed_at).where(Shard.batch_id == batch_id))]


def started(ctx: Any, batch_id: str) -> bool:
    return any(k for _, k in shard_times(ctx, batch_id))


def alone(client: Any, path: Path, n: int) -> float:
    t0 = time.monotonic()
    b = submit(client, path)
    return n / (finish(client, b.id, n) - t0)


def behind(ctx: Any, a: Any, b: Any, large: Path, small: Path, n_large: int,
           n_small: int) -> dict[str, Any]:
    big = submit(a, large)
    while not started(ctx, big.id):
        time.sleep(0.05)
    t0 = time.monotonic()
    little = submit(b, small)
    b_seconds = finish(b, little.id, n_small) - t0
    finish(a, big.id, n_large)
    b_shards, a_shards = shard_times(ctx, little.id), shard_times(ctx, big.id)
    arrival = min(c for c, _ in b_shards if c)
    b_last = max(k for _, k in b_shards if k)
    a_between = sum(1 for _, k in a_shards if k and arrival < k < b_last)
    return {"b_seconds": b_seconds, "a_shards_started_before_b_last": a_between,
            "a_shards": len(a_shards), "b_shards": len(b_shards)}


def run_mode(settings: Any, fair: bool, large: Path, small: Path, n_large: int,
             n_small: int) -> dict[str, Any]:
    from openai import OpenAI

    from cli.stack import Stack
    from jobs.core.context import Context
    from jobs.tenants import auth

    st = settings.model_copy(update={"fair_dispatch": fair, "api_port": free_port()})
    with Stack(st, extra_env={"INFERQ_CHAT_MODEL": ""}) as stack:
        ctx = Context(stack.settings)
        try:
            clients = []
            for name in ("a", "b"):
                _, key = auth.create_tenant(ctx, f"bench-{name}-{time.time_ns()}")
                clients.append(OpenAI(base_url=stack.base_url + "/v1", api_key=key,
                                      max_retries=0, timeout=300))
            a, b = clients
            finish(a, submit(a, small).id, n_small)  # warm-up: one-off costs of the worker
            rate = alone(a, large, n_large)
            out = behind(ctx, a, b, large, small, n_large, n_small)
        finally:
            ctx.close()
    return {"a_rows_per_s": rate, **out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", type=int, default=4000, help="rows of A's batch")
    ap.add_argument("--small", type=int, default=1000, help="rows of B's batch")
    ap.add_argument("--shard-rows", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from jobs.core.settings import Settings

    runs: dict[str, list[dict[str, Any]]] = {"fifo": [], "fair": []}
    with tempfile.TemporaryDirectory() as tmp:
        large, small = Path(tmp) / "large.jsonl", Path(tmp) / "small.jsonl"
        write_embeddings_jsonl(large, texts(args.large, seed=0))
        write_embeddings_jsonl(small, texts(args.small, seed=1))
        st = Settings(data_dir=Path(tmp) / "data", shard_rows=args.shard_rows,
                      janitor_interval_s=1.0)
        for _ in range(args.rounds):
            for mode in ("fifo", "fair"):
                runs[mode].append(run_mode(st, mode == "fair", large, small, args.large,
                                           args.small))
                print(mode, runs[mode][-1], flush=True)
    fifo, fair = runs["fifo"], runs["fair"]
    speedup = [f["b_seconds"] / g["b_seconds"] for f, g in zip(fifo, fair, strict=True)]
    kept = [g["a_rows_per_s"] / f["a_rows_per_s"] for f, g in zip(fifo, fair, strict=True)]

    def col(rs: list[dict[str, Any]], key: str) -> str:
        return spread([float(r[key]) for r in rs])

    rows = [
        ["B's completion time behind A (s)", col(fifo, "b_seconds"), col(fair, "b_seconds"),
         f"FIFO ÷ fair {spread(speedup)}"],
        ["A's shards started after B arrived, before B's last",
         col(fifo, "a_shards_started_before_b_last"),
         col(fair, "a_shards_started_before_b_last"), f"of {fifo[0]['a_shards']}"],
        ["A alone, rows/s", col(fifo, "a_rows_per_s"), col(fair, "a_rows_per_s"),
         f"fair ÷ FIFO {spread(kept)}"],
    ]
    report("fairness",
           f"fair dispatch vs FIFO: B ({args.small} rows) behind A ({args.large} rows), "
           f"shards of {args.shard_rows}, one worker, {args.rounds} rounds",
           ["measure", "FIFO", "fair", "ratio"], rows,
           {"large": args.large, "small": args.small, "shard_rows": args.shard_rows,
            "rounds": args.rounds, "fifo": fifo, "fair": fair,
            "b_speedup": speedup, "throughput_retained": kept})


if __name__ == "__main__":
    main()
