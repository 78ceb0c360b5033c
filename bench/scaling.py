"""Orchestration scaling: items/s of one embeddings batch on N = 1, 2, 4, 8, 16 workers on
the simulated accelerator, against N x the items/s of one.

The workers are real model workers (Celery, the batch lane, the shard pipeline, the
embedding engine, leases and checkpoints) whose model is the simulated accelerator
(``INFERQ_ACCELERATOR=simulated``, ``workers/models/simulated.py``): a forward pass
sleeps for what the profile's cost model says it takes, so the model costs no CPU and
16 workers fit on a small machine. What keeps the fleet from scaling linearly is then
the rest of the service: dispatch, the broker, PostgreSQL, the object store, the API,
and the workers' own CPU (tokenizing, formatting output lines).

The default profile is ``cpu1-minilm`` (one CPU core's speed, ~270 rows/s a worker):
with a GPU profile a worker would be limited by its own CPU, not by its accelerator,
on a 2-core machine, and the benchmark would measure that instead.

One stack (embedded PostgreSQL and Redis, a file:// store, one API process, one control
worker). For each N: the fleet is brought to N batch-lane workers (started or stopped),
the counters are read over an idle window (--idle seconds), then one batch of
N x --rows-per-worker rows (bench.workload.texts, seed N) is uploaded and run. Measured:

- items/s: rows ÷ the time from the first poll that sees the batch ``in_progress`` to the
  first that sees every row counted (polls every 0.25 s through the API);
- per item, over the batch's whole life (upload, validation, shards, finalization, then
  --settle seconds so PostgreSQL's statistics are flushed), net of the idle window's rate:
  PostgreSQL transactions and rows read and written (``pg_stat_database``:
  ``xact_commit`` + ``xact_rollback``; ``tup_returned`` + ``tup_fetched``;
  ``tup_inserted`` + ``tup_updated`` + ``tup_deleted``; pg_stat_statements is not
  loaded in the embedded server, so statements are not counted), Redis commands
  (``INFO commandstats``, the broker's messages among them: pushes to lists are shown
  apart), and CPU seconds (user + system, psutil) of the API (gunicorn and its worker),
  the model workers (Celery main + pool child each), the control worker, PostgreSQL and
  Redis;
- the ratio vs linear: items/s at N ÷ (N x items/s at 1). The goal: ≥ 0.90 at 16.

Every custom_id is checked exactly once in each run's output.

    python -m bench.scaling                       # N = 1,2,4,8,16, ~30 s of work each
    python -m bench.scaling --workers 1,2,4 --rows-per-worker 1500   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.common import free_port, report
from bench.workload import texts, write_embeddings_jsonl

PUSHES = ("lpush", "rpush", "lpushx", "rpushx", "zadd", "publish", "xadd")


@dataclass
class Sample:
    """Cumulative counters at one moment."""

    t: float
    pg: dict[str, int]
    redis: dict[str, int]  # calls per command
    cpu: dict[str, float]  # CPU seconds per role

    def minus(self, other: Sample) -> dict[str, float]:
        out: dict[str, float] = {"seconds": self.t - other.t}
        for k, v in self.pg.items():
            out[f"pg_{k}"] = v - other.pg.get(k, 0)
        out["pg_transactions"] = out["pg_xact_commit"] + out["pg_xact_rollback"]
        out["pg_rows_read"] = out["pg_tup_returned"] + out["pg_tup_fetched"]
        out["pg_rows_written"] = (out["pg_tup_inserted"] + out["pg_tup_updated"]
                                  + out["pg_tup_deleted"])
        cmds = {k: v - other.redis.get(k, 0) for k, v in self.redis.items()}
        out["redis_commands"] = sum(cmds.values())
        out["redis_pushes"] = sum(v for k, v in cmds.items() if k in PUSHES)
        for role, secs in self.cpu.items():
            out[f"cpu_{role}"] = secs - other.cpu.get(role, 0.0)
        return out


@dataclass
class Probe:
    """Reads the counters: PostgreSQL's and Redis's statistics, every process's CPU."""

    stack: Any
    pg_url: str
    redis_url: str
    pgdata: Path
    self_calls: Counter[str] = field(default_factory=Counter)  # Redis calls of the probe

    def __post_init__(self) -> None:
        import redis
        from sqlalchemy import create_engine

        self.engine = create_engine(self.pg_url.replace("postgresql://", "postgresql+psycopg://"),
                                    isolation_level="AUTOCOMMIT", pool_size=1)
        self.r = redis.Redis.from_url(self.redis_url)
        self.procs: dict[int, psutil.Process] = {}
        self.gone: dict[str, float] = {}  # CPU of processes that ended, per role

    def sample(self) -> Sample:
        from sqlalchemy import text

        with self.engine.connect() as c:
            c.execute(text("SELECT pg_stat_clear_snapshot()"))
            row = c.execute(text(
                "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, "
                "tup_updated, tup_deleted FROM pg_stat_database "
                "WHERE datname = current_database()")).mappings().one()
        pg = {k: int(v) for k, v in row.items()}
        stats = self.r.info("commandstats")
        calls = {k.removeprefix("cmdstat_").split("|")[0]: int(v["calls"])
                 for k, v in stats.items()}
        calls.pop("info", None)
        return Sample(time.perf_counter(), pg, calls, self.cpu())

    def roles(self) -> dict[str, list[int]]:
        """Top-level pids per role (their children are counted with them)."""
        out: dict[str, list[int]] = {"api": [], "workers": [], "control": [],
                                     "postgres": [], "redis": []}
        for name, p in self.stack.procs.items():
            role = ("api" if name == "api" else "control" if name == "worker-control"
                    else "workers")
            out[role].append(p.pid)
        for b in self.stack.backends:
            if getattr(b, "proc", None) is not None:
                out["redis"].append(b.proc.pid)
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if cmd and cmd[0].endswith("postgres") and str(self.pgdata) in " ".join(cmd):
                out["postgres"].append(p.pid)
        return out

    def cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, pids in self.roles().items():
            total = self.gone.get(role, 0.0)
            for pid in pids:
                try:
                    top = psutil.Process(pid)
                    for p in [top, *top.children(recursive=True)]:
                        t = p.cpu_times()  # children_*: its children that ended
                        total += t.user + t.system + t.children_user + t.children_system
                except psutil.NoSuchProcess:
                    continue
            out[role] = total
        return out

    def close(self) -> None:
        self.engine.dispose()
        self.r.close()


class Fleet:
    """Keeps N batch-lane workers on the simulated accelerator running."""

    def __init__(self, stack: Any) -> None:
        self.stack, self.n = stack, 0
        self.live: list[str] = []

    def resize(self, n: int, probe: Probe) -> None:
        while len(self.live) < n:
            name = f"sim{self.n}"
            self.n += 1
            self.stack.start_model_worker(name, "batch")
            self.live.append(name)
        while len(self.live) > n:
            name = self.live.pop()
            p = self.stack.procs.pop(f"worker-{name}")
            before = probe.cpu()["workers"]
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            probe.gone["workers"] = probe.gone.get("workers", 0.0) + max(
                0.0, before - probe.cpu()["workers"])
        self.wait_ready(n)

    def wait_ready(self, n: int, timeout: float = 300) -> None:
        import redis

        from jobs.fleet.heartbeats import live_workers

        r = redis.Redis.from_url(self.stack.settings.redis_url)
        deadline = time.monotonic() + timeout
        try:
            while len(live_workers(r, "batch")) != n:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n} workers did not all announce themselves")
                for name in self.live:
                    p = self.stack.procs[f"worker-{name}"]
                    if p.poll() is not None:
                        raise RuntimeError(f"worker {name} exited ({p.returncode}); see "
                                           f"{self.stack.log_dir}/worker-{name}.log")
                time.sleep(0.5)
            beats = live_workers(r, "batch")
            bad = [b["name"] for b in beats if b.get("accelerator") != "simulated"]
            if bad:
                raise RuntimeError(f"workers not on the simulated accelerator: {bad}")
        finally:
            r.close()


def run_one(stack: Any, client: Any, probe: Probe, n: int, args: argparse.Namespace,
            tmp: Path) -> dict[str, Any]:
    rows = n * args.rows_per_worker
    path = tmp / f"input-{n}.jsonl"
    write_embeddings_jsonl(path, texts(rows, seed=n))
    idle0 = probe.sample()
    time.sleep(args.idle)
    idle1 = probe.sample()
    idle = idle1.minus(idle0)
    start = probe.sample()
    with path.open("rb") as fh:
        f = client.files.create(file=(path.name, fh), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    t_run = t_done = None
    polls = 0
    while True:
        b = client.batches.retrieve(b.id)
        polls += 1
        now = time.perf_counter()
        if t_run is None and b.status != "validating":
            t_run = now
        counts = b.request_counts
        if t_done is None and counts is not None and counts.total and \
                counts.completed + counts.failed >= counts.total:
            t_done = now
        if b.status in ("completed", "failed", "cancelled", "expired"):
            t_done = t_done or now
            break
        time.sleep(0.25)
    t_end = time.perf_counter()
    time.sleep(args.settle)
    end = probe.sample()
    life = end.minus(start)
    assert t_run is not None and t_done is not None
    out = client.files.content(b.output_file_id).read().splitlines() if b.output_file_id else []
    err = client.files.content(b.error_file_id).read().splitlines() if b.error_file_id else []
    seen = Counter(json.loads(x)["custom_id"] for x in out + err if x)
    ids = {f"req-{i}" for i in range(rows)}
    net = {k: v - idle[k] / idle["seconds"] * life["seconds"]
           for k, v in life.items() if k != "seconds"}
    per_item = {k: v / rows for k, v in net.items()}
    return {
        "workers": n, "rows": rows, "status": b.status, "failed": len(err),
        "lost": len(ids - set(seen)), "duplicated": sum(1 for c in seen.values() if c > 1),
        "run_s": t_done - t_run, "batch_s": t_end - start.t,
        "items_per_s": rows / (t_done - t_run), "polls": polls,
        "per_item": per_item, "totals": life, "idle_per_s": {
            k: v / idle["seconds"] for k, v in idle.items() if k != "seconds"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--rows-per-worker", type=int, default=8000,
                    help="rows of each run per worker (~30 s at cpu1-minilm's ~270 rows/s)")
    ap.add_argument("--profile", default="cpu1-minilm")
    ap.add_argument("--shard-rows", type=int, default=500)
    ap.add_argument("--idle", type=float, default=10.0,
                    help="seconds of the idle window read before each run")
    ap.add_argument("--settle", type=float, default=11.0,
                    help="seconds after a run before its counters are read (PostgreSQL "
                         "flushes an idle backend's statistics within 10 s)")
    args = ap.parse_args()
    ns = [int(x) for x in args.workers.split(",")]

    from openai import OpenAI

    from cli.stack import Stack
    from jobs.core.settings import Settings

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        st = Settings(data_dir=tmp / "data", api_port=free_port(), chat_model="",
                      accelerator="simulated", simulated_profile=args.profile,
                      shard_rows=args.shard_rows)
        stack = Stack(st, model_workers=0)
        results: list[dict[str, Any]] = []
        try:
            stack.start(api=True, workers=True)
            probe = Probe(stack, stack.settings.database_url, stack.settings.redis_url,
                          tmp / "data" / "pg")
            client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key,
                            max_retries=5, timeout=120)
            fleet = Fleet(stack)
            fleet.resize(1, probe)
            warm = tmp / "warm.jsonl"
            write_embeddings_jsonl(warm, texts(200, seed=99))
            with warm.open("rb") as fh:
                f = client.files.create(file=(warm.name, fh), purpose="batch")
            wb = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                       completion_window="24h")
            while client.batches.retrieve(wb.id).status not in ("completed", "failed"):
                time.sleep(0.5)
            for n in ns:
                fleet.resize(n, probe)
                time.sleep(args.settle)  # the start's statistics flushed before the idle window
                r = run_one(stack, client, probe, n, args, tmp)
                results.append(r)
                print(f"N={n}: {r['rows']} rows in {r['run_s']:.1f}s = "
                      f"{r['items_per_s']:.0f} items/s; lost {r['lost']}, "
                      f"duplicated {r['duplicated']}, failed {r['failed']}")
            probe.close()
        finally:
            stack.stop()

    one = next((r["items_per_s"] for r in results if r["workers"] == 1), None)
    for r in results:
        r["vs_linear"] = r["items_per_s"] / (r["workers"] * one) if one else None
    rows = []
    for r in results:
        p = r["per_item"]
        other = p["cpu_control"] + p["cpu_postgres"] + p["cpu_redis"]
        rows.append([r["workers"], r["rows"], f"{r['run_s']:.1f}", f"{r['items_per_s']:.0f}",
                     "-" if r["vs_linear"] is None else f"{r['vs_linear']:.3f}",
                     f"{p['pg_transactions'] * 1e3:.1f}", f"{p['pg_rows_written'] * 1e3:.0f}",
                     f"{p['redis_commands'] * 1e3:.0f}", f"{p['redis_pushes'] * 1e3:.1f}",
                     f"{p['cpu_api'] * 1e6:.0f}", f"{p['cpu_workers'] * 1e6:.0f}",
                     f"{other * 1e6:.0f}", f"{r['lost']}/{r['duplicated']}"])
    report("scaling", f"orchestration scaling: embeddings on the simulated accelerator "
           f"({args.profile}), {args.rows_per_worker} rows per worker, shards of "
           f"{args.shard_rows}; per 1,000 items and CPU µs per item, net of idle",
           ["workers", "rows", "run s", "items/s", "÷ linear", "PG xact/1k",
            "PG rows written/1k", "Redis cmds/1k", "pushes/1k", "API µs", "workers µs",
            "ctl+PG+Redis µs", "lost/dup"], rows,
           {"args": vars(args), "runs": results, "goal": "vs_linear >= 0.90 at 16 workers",
            "chunk_rows": st.chunk_rows, "cpus": os.cpu_count()})
    bad = [r for r in results if r["lost"] or r["duplicated"] or r["status"] != "completed"]
    if bad:
        raise SystemExit(f"{len(bad)} run(s) lost or duplicated results or did not complete")


if __name__ == "__main__":
    main()
