"""Chaos: one large embeddings batch on three workers while they are killed.

One stack (embedded PostgreSQL, redis-server with AOF on a unix socket, a file://
store), three model workers on the batch lane, each re-started by this script
as a supervisor would. Two runs of the same batch in one session, in turn:

- undisturbed: the batch alone;
- chaos: every U(0.5, 1.5) x --kill-every seconds a random model worker is
  SIGKILLed (its whole process group, as the OOM killer or a lost node would)
  and a replacement is started; once, at ~25 % progress, a worker gets SIGTERM
  (a spot notice: it commits its chunk and hands the shard back), and once, at
  ~50 %, redis-server is stopped and started again --redis-down seconds later.

Checked after each run, from the downloaded output and error files: every
custom_id exactly once (lost = missing, duplicated = more than once). Reported:
wall time, shard attempts, and two measures of redone work from the workers'
counters: rows computed twice (results produced but not committed before an
interruption, the shards' ``rows_computed`` beyond the total: at most one chunk
per interruption) and rows started again (handed to the engine more than once,
``rows_started``: also counts the chunk a kill cut short), and the slowdown
(chaos wall time ÷ undisturbed wall time of the same round).

Workload: bench.workload.texts(N, seed=0). The lease is shortened to --lease
seconds so a killed worker's shard is handed on sooner; everything else is the
default configuration, the same for both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import free_port, report, spread
from bench.workload import texts, write_embeddings_jsonl
from cli.supervisor import Child


@dataclass
class Events:
    kills: int = 0
    sigterm_drain_s: float | None = None
    sigterm_exit: int | None = None
    redis_down_s: float | None = None
    api_errors: int = 0
    log: list[str] = field(default_factory=list)

    def note(self, t0: float, what: str) -> None:
        self.log.append(f"{time.perf_counter() - t0:7.1f}s {what}")


class Supervisor:
    """Keeps ``size`` model workers running; names are never reused."""

    def __init__(self, stack: Any, size: int) -> None:
        self.stack, self.size = stack, size
        self.n = 0
        self.live: dict[str, Child] = {}
        self.spawned: dict[str, float] = {}  # name -> wall-clock start
        self.ended: dict[str, float] = {}
        self.lock = threading.Lock()

    def fill(self) -> None:
        with self.lock:
            while len(self.live) < self.size:
                name = f"w{self.n}"
                self.n += 1
                self.spawned[name] = time.time()
                self.live[name] = self.stack.start_model_worker(name, "batch")

    def take(self, rng: random.Random) -> Child:
        with self.lock:
            name = rng.choice(sorted(self.live))
            self.stack.procs.pop(f"worker-{name}", None)
            self.ended[name] = time.time()
            return self.live.pop(name)

    def startup_s(self, since: float) -> list[float]:
        """Spawn → model loaded, for workers spawned after ``since`` that got that far
        (from the "ready" line in each worker's log)."""
        out = []
        for name, t0 in self.spawned.items():
            if t0 < since:
                continue
            log = self.stack.log_dir / f"worker-{name}.log"
            for line in log.read_text(errors="replace").splitlines():
                if " ready: lanes=" in line:
                    stamp = datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
                    out.append(stamp.timestamp() - t0)  # logs use local time
                    break
        return out

    def lives_s(self, since: float, until: float) -> list[float]:
        """How long each worker spawned after ``since`` lived (until killed or ``until``)."""
        return [self.ended.get(n, until) - t0 for n, t0 in self.spawned.items() if t0 >= since]


def kill_group(p: Child) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def progress(client: Any, batch_id: str, ev: Events) -> Any:
    from openai import APIError

    try:
        return client.batches.retrieve(batch_id)
    except APIError:
        ev.api_errors += 1
        return None


def chaos(sup: Supervisor, redis_server: Any, client: Any, batch_id: str,
          total: int, args: argparse.Namespace, ev: Events, done: threading.Event,
          t0: float) -> None:
    rng = random.Random(args.seed)
    sigtermed = redis_restarted = False
    next_kill = time.perf_counter() + args.kill_every * rng.uniform(0.5, 1.5)
    while not done.wait(0.2):
        b = progress(client, batch_id, ev)
        frac = (b.request_counts.completed / total) if b is not None else 0.0
        if b is not None and b.status not in ("validating", "in_progress"):
            return
        if not sigtermed and frac >= 0.25:
            sigtermed = True
            p = sup.take(rng)
            t = time.perf_counter()
            os.kill(p.pid, signal.SIGTERM)
            ev.note(t0, f"SIGTERM worker pid {p.pid}")
            try:
                ev.sigterm_exit = p.wait(args.notice + 30)
            except subprocess.TimeoutExpired:
                kill_group(p)
            ev.sigterm_drain_s = time.perf_counter() - t
            ev.note(t0, f"  drained and exited in {ev.sigterm_drain_s:.1f}s")
            sup.fill()
        if not redis_restarted and frac >= 0.5:
            redis_restarted = True
            t = time.perf_counter()
            ev.note(t0, "redis-server stopped")
            redis_server.stop()
            time.sleep(args.redis_down)
            redis_server.start()
            ev.redis_down_s = time.perf_counter() - t
            ev.note(t0, f"  redis-server back after {ev.redis_down_s:.1f}s")
        if time.perf_counter() >= next_kill:
            p = sup.take(rng)
            kill_group(p)
            ev.kills += 1
            ev.note(t0, f"SIGKILL worker pid {p.pid} at {frac:.0%}")
            sup.fill()
            next_kill = time.perf_counter() + args.kill_every * rng.uniform(0.5, 1.5)


def run(stack: Any, sup: Supervisor, redis_server: Any, client: Any, path: Path,
        ids: set[str], args: argparse.Namespace, disturbed: bool) -> dict[str, Any]:
    from sqlalchemy import select

    from jobs.core.context import Context
    from jobs.core.schema import Shard

    ev = Events()
    sup.fill()
    wall0 = time.time()
    t0 = time.perf_counter()
    with path.open("rb") as fh:
        f = client.files.create(file=(path.name, fh), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    done = threading.Event()
    th = None
    if disturbed:
        th = threading.Thread(target=chaos, args=(sup, redis_server, client, b.id,
                                                  len(ids), args, ev, done, t0), daemon=True)
        th.start()
    while b.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.5)
        b = progress(client, b.id, ev) or b
    wall = time.perf_counter() - t0
    done.set()
    if th is not None:
        th.join()
    out = client.files.content(b.output_file_id).read().splitlines() \
        if b.output_file_id else []
    err = client.files.content(b.error_file_id).read().splitlines() if b.error_file_id else []
    seen = Counter(json.loads(x)["custom_id"] for x in out + err if x)
    ctx = Context(stack.settings)
    with ctx.db.session() as s:
        rows = s.execute(select(Shard.attempt, Shard.stalls, Shard.rows_started,
                                Shard.rows_computed).where(Shard.batch_id == b.id)).all()
    attempts, stalls = [r[0] for r in rows], [r[1] for r in rows]
    started, computed = sum(r[2] for r in rows), sum(r[3] for r in rows)
    ctx.close()
    starts = sup.startup_s(wall0)
    lives = sup.lives_s(wall0, time.time())
    return {
        "disturbed": disturbed, "status": b.status, "wall_s": wall,
        "requests": len(ids), "completed": b.request_counts.completed,
        "failed": b.request_counts.failed,
        "lost": len(ids - set(seen)), "duplicated": sum(1 for c in seen.values() if c > 1),
        "unexpected": len(set(seen) - ids),
        "shards": len(attempts), "attempts_total": sum(attempts),
        "attempts_max": max(attempts, default=0), "stalls_max": max(stalls, default=0),
        "shards_retried": sum(1 for a in attempts if a > 1),
        "computed_rows": computed, "recomputed_rows": computed - len(ids),
        "started_rows": started, "restarted_rows": started - len(ids),
        "kills": ev.kills, "workers_started": len(lives),
        "worker_startup_s_median": statistics.median(starts) if starts else None,
        "worker_life_s_median": statistics.median(lives) if lives else None,
        "sigterm_drain_s": ev.sigterm_drain_s,
        "sigterm_exit": ev.sigterm_exit, "redis_down_s": ev.redis_down_s,
        "api_errors_while_polling": ev.api_errors, "events": ev.log,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kill-every", type=float, default=5.0,
                    help="mean seconds between SIGKILLs, uniform in [0.5x, 1.5x]")
    ap.add_argument("--redis-down", type=float, default=3.0)
    ap.add_argument("--lease", type=float, default=10.0)
    ap.add_argument("--notice", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from openai import OpenAI

    from cli.stack import Stack
    from jobs.core.settings import Settings
    from storage.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port(), lease_seconds=args.lease,
                      chat_model="", spot_notice_s=args.notice, torch_threads=1)
        path = Path(tmp) / "input.jsonl"
        write_embeddings_jsonl(path, texts(args.n, seed=0))
        ids = {f"req-{i}" for i in range(args.n)}
        stack = Stack(st, model_workers=0)
        try:
            stack.start(api=True, workers=True)
            redis_server = next(b for b in stack.backends if isinstance(b, EmbeddedRedis))
            sup = Supervisor(stack, args.workers)
            client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key,
                            max_retries=5, timeout=60)
            warm = Path(tmp) / "warm.jsonl"
            write_embeddings_jsonl(warm, texts(300, seed=1))
            run(stack, sup, redis_server, client, warm, {f"req-{i}" for i in range(300)},
                args, disturbed=False)
            results: list[dict[str, Any]] = []
            for _ in range(args.rounds):
                for disturbed in (False, True):
                    r = run(stack, sup, redis_server, client, path, ids, args, disturbed)
                    results.append(r)
                    print(f"{'chaos' if disturbed else 'undisturbed'}: {r['wall_s']:.1f}s, "
                          f"lost {r['lost']}, duplicated {r['duplicated']}, kills {r['kills']}, "
                          f"workers started {r['workers_started']}, startup median "
                          f"{r['worker_startup_s_median']}, life median "
                          f"{r['worker_life_s_median']}")
                    for line in r["events"]:
                        print("   ", line)
        finally:
            stack.stop()

    calm = [r for r in results if not r["disturbed"]]
    wild = [r for r in results if r["disturbed"]]
    slow = [w["wall_s"] / c["wall_s"] for c, w in zip(calm, wild, strict=True)]

    def col(key: str, rs: list[dict[str, Any]]) -> str:
        vals = [r[key] for r in rs]
        return ", ".join("-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
                         for v in vals)

    rows = [[label, col("wall_s", rs), spread([args.n / r["wall_s"] for r in rs]),
             col("lost", rs), col("duplicated", rs), col("failed", rs),
             col("attempts_total", rs) + " / " + col("shards", rs), col("attempts_max", rs),
             col("recomputed_rows", rs), col("restarted_rows", rs), col("kills", rs),
             col("workers_started", rs) + " (" + col("worker_startup_s_median", rs) + " s)"]
            for label, rs in (("undisturbed", calm), ("chaos", wild))]
    rows.append(["chaos ÷ undisturbed wall time", spread(slow), *[""] * 10])
    report("chaos", f"chaos: {args.n} embeddings requests, {args.workers} workers, "
           f"SIGKILL every ~{args.kill_every:g}s, one SIGTERM, one Redis restart",
           ["run", "wall s", "requests/s", "lost", "duplicated", "failed",
            "attempts / shards", "max attempts", "rows computed twice", "rows started again",
            "SIGKILLs", "worker starts (median startup)"], rows,
           {"n": args.n, "args": vars(args), "runs": results, "slowdown": slow,
            "shard_rows": st.shard_rows, "chunk_rows": st.chunk_rows})
    bad = [r for r in results if r["lost"] or r["duplicated"] or r["unexpected"]]
    if bad:
        raise SystemExit(f"{len(bad)} run(s) lost or duplicated results")


if __name__ == "__main__":
    main()
