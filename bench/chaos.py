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

``--mode generation``: a chat batch instead (greedy, max_tokens 16-96, --chat-model
on the engine ``--engine`` names: vllm, the default configuration's, or transformers),
and each SIGKILL (and the SIGTERM) is timed while a
shard is running (workers build the chat engine before they take a shard): its victim
is a worker whose pool child has held a running shard for U(0.5, 1.5) x --kill-every
seconds (mid-generation, never as its attempt starts).
Also checked: 0 failed rows, every output equal to the undisturbed run's (greedy,
row by row), and the batch's usage equal to the sum of its lines'. A generation row
"started again" resumes after the tokens its shard's last commit saved of it
(jobs/batches/resume.py), not from its prompt.
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

    def __init__(self, stack: Any, size: int, **env: str) -> None:
        self.stack, self.size, self.env = stack, size, env
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
                self.live[name] = self.stack.start_model_worker(name, "batch", **self.env)

    def take(self, rng: random.Random, among: set[int] | None = None) -> Child:
        """A live worker (one whose pid is in ``among``, when given and any is) leaves
        the pool, for the caller to stop."""
        with self.lock:
            names = sorted(n for n, p in self.live.items() if among is None or p.pid in among)
            name = rng.choice(names or sorted(self.live))
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


def parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def holders(stack: Any, batch_id: str) -> dict[int, float]:
    """The workers (the supervised processes' pids) whose pool child holds a running
    shard of the batch, with how long its attempt has run (seconds)."""
    from sqlalchemy import select

    from jobs.core.context import Context
    from jobs.core.schema import Shard

    ctx = Context(stack.settings)
    try:
        with ctx.db.session() as s:
            held = s.execute(select(Shard.worker, Shard.claimed_at).where(
                Shard.batch_id == batch_id, Shard.status == "running")).all()
    finally:
        ctx.close()
    now = time.time()
    return {parent_of(int(w.rsplit(":", 1)[1])): now - (at or now) for w, at in held if w}


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
    generation = args.mode == "generation"
    hold = args.kill_every * rng.uniform(0.5, 1.5)
    while not done.wait(0.2):
        b = progress(client, batch_id, ev)
        frac = (b.request_counts.completed / total) if b is not None else 0.0
        if b is not None and b.status not in ("validating", "in_progress"):
            return
        running = None
        if generation:  # kills only mid-generation: of a live worker whose attempt at a
            # shard has run ``hold`` seconds (drawn as the gaps between kills are)
            running = {pid for pid, ran in holders(sup.stack, batch_id).items()
                       if ran >= hold}
            if not running.intersection(p.pid for p in sup.live.values()):
                continue
        if not sigtermed and frac >= 0.25:
            sigtermed = True
            p = sup.take(rng, running)
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
            continue  # the batch and its shards' holders have moved on meanwhile
        if not redis_restarted and frac >= 0.5:
            redis_restarted = True
            t = time.perf_counter()
            ev.note(t0, "redis-server stopped")
            redis_server.stop()
            time.sleep(args.redis_down)
            redis_server.start()
            ev.redis_down_s = time.perf_counter() - t
            ev.note(t0, f"  redis-server back after {ev.redis_down_s:.1f}s")
            continue
        if time.perf_counter() >= next_kill:
            p = sup.take(rng, running)
            kill_group(p)
            ev.kills += 1
            ev.note(t0, f"SIGKILL worker pid {p.pid} at {frac:.0%}")
            sup.fill()
            next_kill = time.perf_counter() + args.kill_every * rng.uniform(0.5, 1.5)
            hold = args.kill_every * rng.uniform(0.5, 1.5)


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
    endpoint = "/v1/chat/completions" if args.mode == "generation" else "/v1/embeddings"
    b = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")
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
    lines = [json.loads(x) for x in out if x]
    seen = Counter(x["custom_id"] for x in lines + [json.loads(x) for x in err if x])
    answers = {x["custom_id"]: answer(x["response"]["body"]) for x in lines}
    used = [x["response"]["body"].get("usage") or {} for x in lines]
    usage_ok = (b.usage is None or (b.usage.input_tokens == sum(u.get("prompt_tokens", 0)
                                                                for u in used)
                and b.usage.output_tokens == sum(u.get("completion_tokens", 0) for u in used)))
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
        "usage_equals_lines": usage_ok, "answers": answers,
    }


def answer(body: dict[str, Any]) -> Any:
    """What a row's output says (choices for chat; embeddings are compared by count)."""
    return body.get("choices") or len(body.get("data") or [])


def write_chat_jsonl(path: Path, n: int, model: str, seed: int) -> None:
    """``n`` greedy chat requests of 16 to 96 tokens."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i, (_, text) in enumerate(texts(n, seed=seed, max_sentences=3)):
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                                "url": "/v1/chat/completions",
                                "body": {"model": model, "temperature": 0,
                                         "max_tokens": rng.randint(16, 96),
                                         "messages": [{"role": "user", "content":
                                                       f"Continue this story: {text}"}]}})
                    + "\n")


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
    ap.add_argument("--mode", choices=("embeddings", "generation"), default="embeddings")
    ap.add_argument("--chat-model", default="SmolLM2-135M-Instruct",
                    help="generation: the chat model")
    ap.add_argument("--engine", choices=("vllm", "transformers"), default="vllm",
                    help="generation: the engine the chat model runs on")
    args = ap.parse_args()
    gen = args.mode == "generation"

    from openai import OpenAI

    from cli.stack import Stack
    from jobs.core.settings import Settings
    from storage.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port(), lease_seconds=args.lease,
                      chat_model=args.chat_model if gen else "", spot_notice_s=args.notice,
                      torch_threads=1, auto_engine=args.engine)
        path = Path(tmp) / "input.jsonl"
        if gen:
            write_chat_jsonl(path, args.n, args.chat_model, seed=0)
        else:
            write_embeddings_jsonl(path, texts(args.n, seed=0))
        ids = {f"req-{i}" for i in range(args.n)}
        stack = Stack(st, model_workers=0)
        try:
            stack.start(api=True, workers=True)
            redis_server = next(b for b in stack.backends if isinstance(b, EmbeddedRedis))
            # generation: a worker builds its chat engine before it takes a shard (as
            # `inferq up` starts them), so a kill timed by a shard's hold is mid-generation
            sup = Supervisor(stack, args.workers,
                             **({"INFERQ_PRELOAD_CHAT_MODEL": "true"} if gen else {}))
            client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key,
                            max_retries=5, timeout=60)
            warm, nwarm = Path(tmp) / "warm.jsonl", 20 if gen else 300
            if gen:
                write_chat_jsonl(warm, nwarm, args.chat_model, seed=1)
            else:
                write_embeddings_jsonl(warm, texts(nwarm, seed=1))
            run(stack, sup, redis_server, client, warm, {f"req-{i}" for i in range(nwarm)},
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
    for c, w in zip(calm, wild, strict=True):
        w["outputs_differing"] = sum(1 for k, v in c["answers"].items()
                                     if w["answers"].get(k, v) != v)
    for r in results:
        r.pop("answers")

    def col(key: str, rs: list[dict[str, Any]]) -> str:
        vals = [r[key] for r in rs]
        return ", ".join("-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
                         for v in vals)

    rows = [[label, col("wall_s", rs), spread([args.n / r["wall_s"] for r in rs]),
             col("lost", rs), col("duplicated", rs), col("failed", rs),
             col("attempts_total", rs) + " / " + col("shards", rs), col("attempts_max", rs),
             col("recomputed_rows", rs), col("restarted_rows", rs), col("kills", rs),
             col("usage_equals_lines", rs), col("outputs_differing", rs) if rs is wild else "-",
             col("workers_started", rs) + " (" + col("worker_startup_s_median", rs) + " s)"]
            for label, rs in (("undisturbed", calm), ("chaos", wild))]
    rows.append(["chaos ÷ undisturbed wall time", spread(slow), *[""] * 12])
    what = (f"chat requests ({args.chat_model}, {args.engine} engine)" if gen
            else "embeddings requests")
    report(f"chaos-{args.mode}-{args.engine}" if gen else "chaos",
           f"chaos: {args.n} {what}, {args.workers} workers, "
           f"SIGKILL every ~{args.kill_every:g}s, one SIGTERM, one Redis restart",
           ["run", "wall s", "requests/s", "lost", "duplicated", "failed",
            "attempts / shards", "max attempts", "rows computed twice", "rows started again",
            "SIGKILLs", "usage = lines", "outputs differing",
            "worker starts (median startup)"], rows,
           {"n": args.n, "args": vars(args), "runs": results, "slowdown": slow,
            "shard_rows": st.shard_rows, "chunk_rows": st.chunk_rows})
    bad = [r for r in results if r["lost"] or r["duplicated"] or r["unexpected"]
           or r["failed"] or r.get("outputs_differing") or not r["usage_equals_lines"]]
    if bad:
        raise SystemExit(f"{len(bad)} run(s) lost, duplicated, failed or changed results")


if __name__ == "__main__":
    main()
