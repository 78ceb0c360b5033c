"""Generation shards: rows are committed as they finish, at least every
``generation_commit_s``, so an interruption loses at most those seconds of work.

A generation row takes from a fraction of a second to minutes, and rows on one
engine finish out of order, so a generation shard is not cut into chunks that commit
whole (a chunk of a few hundred rows can outlast a spot notice, and every attempt
interrupted before its end would commit nothing). Up to ``2 x chunk_rows`` rows are
on the engine at once, each its own request; every ``generation_commit_s`` (and when
the last row finishes) the rows finished since the last commit are written to the
next output part, keyed by (shard, part, attempt) as a chunk's parts are, and
committed by the same fenced checkpoint, which records their positions
(``done_rows``, jobs/batches/done_rows.py) with their counts and usage. The next
attempt runs only the rows no checkpoint committed: a finished row is never
computed again, and none is committed twice.

Each commit also saves the tokens the unfinished rows generated so far
(jobs/batches/resume.py), and a commit is made every ``generation_commit_s`` when
they grew even if no row finished (a part of no lines). The next attempt continues
those rows after their saved tokens, so an interruption costs the seconds since the
last commit, not each running row's answer so far; and an attempt that saved tokens
made progress, so rows longer than the time between interruptions still finish.

A row that failed on the server's side (a 5xx) is not committed: once the rest is
done the attempt ends as a failed one and the next computes that row again (the
attempt cap counts attempts that committed nothing: no finished row, no new token).
On SIGTERM no new row starts; the running ones get ``drain_s`` to finish, committed
as they do, what the others generated is saved at the deadline, and the shard is
handed back, an attempt that is never counted as a stall.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TypeGuard

from jobs.batches import done_rows, resume
from jobs.batches import queries as repo
from jobs.batches.outputs import Tokens
from jobs.batches.views import read_shard
from jobs.core.context import Context
from jobs.core.lanes import lane_for
from jobs.core.schema import Shard
from jobs.core.status import ShardOutcome, ShardStatus
from storage import keys
from workers.process import metrics
from workers.shards.fencing import (
    LeaseKeeper,
    Payer,
    ServerFaults,
    ShardResult,
    count_rows,
    log,
    release,
)
from workers.shards.runners import Chunk, RowRunner, Runner

POLL_S = 0.25  # how long one look for finished rows waits
CHECK_S = 1.0  # how often the batch's state (cancelled, expired) is looked up


class RowShard:
    """One attempt at a generation shard: its rows on the engine, finished, committed."""

    def __init__(self, ctx: Context, runner: RowRunner, sh: Shard, token: str, prio: int,
                 keeper: LeaseKeeper, payer: Payer) -> None:
        self.ctx, self.runner, self.token, self.prio = ctx, runner, token, prio
        self.keeper, self.payer = keeper, payer
        self.batch_id, self.index, self.shard_id = sh.batch_id, sh.index, sh.id
        self.attempt, self.part = sh.attempt, sh.chunks_done
        self.done = done_rows.positions(sh)
        self.todo = deque((i, r) for i, r in enumerate(read_shard(ctx.store, sh))
                          if i not in self.done)
        # tokens to resume each unfinished row from, and how many the last commit saved
        self.resume = {i: t for i, t in resume.load(ctx.store, sh).items()
                       if i not in self.done}
        self.saved = {i: len(t) for i, t in self.resume.items()}
        self.window = max(1, 2 * ctx.settings.chunk_rows)
        self.running: dict[int, Chunk] = {}
        self.finished: list[tuple[int, Chunk]] = []
        self.faults: list[str] = []
        self.draining = False

    def start_rows(self) -> None:
        started = 0
        while self.todo and len(self.running) < self.window and not self.draining:
            i, row = self.todo.popleft()
            self.running[i] = self.runner.submit([row], self.prio, self.resume.get(i))
            started += 1
        if started:
            count_rows(self.ctx, self.shard_id, started, 0)

    def wait(self) -> None:
        """Wait up to POLL_S for a running row, then move every finished one along."""
        if self.running:
            self.runner.done(next(iter(self.running.values())), POLL_S)
        for i, chunk in list(self.running.items()):
            if self.runner.done(chunk, 0):
                self.finished.append((i, self.running.pop(i)))

    def progress(self) -> resume.Tokens:
        """The tokens each unfinished row may resume from: those a running row generated
        so far, those a row not started again was given."""
        out = {i: t for i, t in self.resume.items() if i not in self.running}
        for i, chunk in self.running.items():
            if chunk.progress is not None and (tokens := chunk.progress()):
                out[i] = tokens
        return out

    def advanced(self, tokens: resume.Tokens) -> bool:
        """Whether ``tokens`` holds more than the last commit saved."""
        return any(len(t) > self.saved.get(i, 0) for i, t in tokens.items())

    def cancel(self) -> None:
        for chunk in self.running.values():
            self.runner.cancel(chunk)
        self.running.clear()

    def commit(self, healthy: Callable[[], bool]) -> ShardResult | None:
        """Write and commit the finished rows as the next part, with the tokens the
        unfinished ones may resume from; a result ends the attempt."""
        rows, self.finished = self.finished, []
        ok, err, positions = [], [], []
        completed = failed = 0
        tokens, seconds = Tokens(), 0.0
        for i, chunk in rows:
            o, e, nok, nerr, t = self.runner.collect(chunk)
            if chunk.faults:  # computed again by the next attempt
                self.faults.extend(chunk.faults)
                continue
            ok.append(o)
            err.append(e)
            positions.append(i)
            completed, failed = completed + nok, failed + nerr
            tokens, seconds = tokens.plus(t), seconds + chunk.seconds
        p = self.payer
        lane = lane_for(p.service_tier)
        metrics.BATCH_ROWS.labels(lane, p.model, "ok").inc(completed)
        metrics.BATCH_ROWS.labels(lane, p.model, "error").inc(failed + len(rows) -
                                                               len(positions))
        metrics.ACCEL_SECONDS.labels(lane, p.model).inc(seconds)
        if rows:
            count_rows(self.ctx, self.shard_id, 0, len(rows))
        if not healthy():
            self.cancel()
            return self.release(ShardStatus.QUEUED, ShardOutcome.HANDED_BACK,
                                "handed back: this worker's model keeps failing", True)
        unfinished = self.progress()
        if not positions and not self.advanced(unfinished):
            return None
        c, st = self.part, self.ctx.settings
        resume.save(self.ctx.store, self.batch_id, self.index, c, self.attempt, unfinished)
        self.ctx.store.put_bytes(keys.output_part(self.batch_id, self.index, c, "ok",
                                                  self.attempt), b"".join(ok))
        self.ctx.store.put_bytes(keys.output_part(self.batch_id, self.index, c, "err",
                                                  self.attempt), b"".join(err))
        bill = p.bill(self.ctx, self.shard_id, self.batch_id, c, completed, tokens, seconds)
        done = self.done.union(positions)
        with self.ctx.db.session() as s:
            committed = not self.keeper.lost and repo.checkpoint(
                s, self.shard_id, self.token, self.attempt, c + 1, len(positions), completed,
                failed, tokens, st.lease_seconds, bill, done=done_rows.ranges(done))
            stopping = committed and repo.batch_stopping(s, self.batch_id)
        if not committed:
            self.cancel()
            log.warning("shard %s: lease lost at part %d, stopping", self.shard_id, c)
            return ShardResult(ShardOutcome.FENCED)
        self.done, self.part = done, c + 1
        self.saved = {i: len(t) for i, t in unfinished.items()}
        if stopping:  # cancelled, or its completion window passed
            self.cancel()
            return self.release(ShardStatus.CANCELLED, ShardOutcome.CANCELLED)
        return None

    def release(self, status: ShardStatus, outcome: ShardOutcome, error: str | None = None,
                not_its_fault: bool = False) -> ShardResult:
        return release(self.ctx, self.batch_id, self.shard_id, self.token, status, outcome,
                       error, not_its_fault)

    def stopping(self) -> bool:
        with self.ctx.db.session() as s:
            return repo.batch_stopping(s, self.batch_id)


def run_rows(ctx: Context, runner: RowRunner, sh: Shard, token: str, prio: int,
             stop_requested: Callable[[], bool], healthy: Callable[[], bool],
             keeper: LeaseKeeper, payer: Payer) -> ShardResult:
    """Run the shard's uncommitted rows, committing the finished ones at least every
    ``generation_commit_s``; see the module's docstring."""
    st = ctx.settings
    job = RowShard(ctx, runner, sh, token, prio, keeper, payer)
    now = time.monotonic()
    last_commit, last_check, drain_by = now, now, None
    job.start_rows()
    while job.running or job.finished:
        job.wait()
        job.start_rows()
        now = time.monotonic()
        if now - last_check >= CHECK_S:
            last_check = now
            if job.stopping():
                job.cancel()
                return job.release(ShardStatus.CANCELLED, ShardOutcome.CANCELLED)
        if drain_by is None and stop_requested():
            job.draining, drain_by = True, now + st.drain_s
        out_of_time = drain_by is not None and now >= drain_by
        due = out_of_time or now - last_commit >= st.generation_commit_s
        if (job.finished and not job.running) or due:
            last_commit = now
            result = job.commit(healthy)
            if result is not None:
                return result
        if out_of_time:
            break
    if job.running or job.todo:  # asked to stop: what finished is committed
        left = len(job.running) + len(job.todo)
        job.cancel()
        log.info("shard %s: handed back on stop with %d rows committed and %d to run",
                 sh.id, len(job.done), left)
        return job.release(ShardStatus.QUEUED, ShardOutcome.HANDED_BACK, not_its_fault=True)
    if job.faults:
        raise ServerFaults(job.part, job.faults)
    return job.release(ShardStatus.DONE, ShardOutcome.DONE)


def commits_rows(runner: Runner) -> TypeGuard[RowRunner]:
    """Whether ``runner``'s rows are committed as they finish (generation) rather
    than in chunks (embeddings: a chunk's rows finish together)."""
    return bool(getattr(runner, "commits_rows", False))
