"""Output parts against real PostgreSQL and the S3 server, with the shard pipeline
driven directly by runners the test controls (no workers, no sleeps).

- A worker whose lease lapsed writes its chunk after the new holder committed the
  same chunk index (with another chunk size): its part lands under its own attempt's
  key, and finalize reads the committed holder's parts, every custom_id once.
- A part the checkpoint committed that is gone fails the batch, naming it.
- Chunks committed before attempts were recorded are read from the old key layout.
- A chunk with a line that failed on the server's side is not committed: the next
  attempt computes it again, and every custom_id has its one result line.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
from sqlalchemy import update

from jobs.batches import finalize, outputs
from jobs.batches import queries as repo
from jobs.batches.outputs import Tokens
from jobs.core.context import Context
from jobs.core.schema import Batch, File, Shard, new_id
from jobs.core.settings import Settings
from jobs.core.status import BatchStatus, ShardOutcome, ShardStatus
from storage import keys
from storage.parquet import shard_bytes
from tests.factories import batch_rows, row, shard_row
from workers.shards.pipeline import process_shard
from workers.shards.runners import Chunk, Lines

ROWS = 10


class ScriptedRunner:
    """Answers every request with a line naming this worker and ``per_row`` prompt
    tokens of usage; with ``hold`` set, each ``collect`` waits for it (the test lets
    the chunk finish when it chooses) and says so on ``collecting``."""

    def __init__(self, name: str, per_row: int, hold: threading.Event | None = None) -> None:
        self.name, self.per_row, self.hold = name, per_row, hold
        self.collecting = threading.Event()

    def submit(self, rows: list[dict[str, Any]], prio: int) -> Chunk:
        return Chunk(rows, [])

    def done(self, chunk: Chunk, timeout: float) -> bool:
        self.collecting.set()
        return self.hold is None or self.hold.wait(timeout)

    def collect(self, chunk: Chunk) -> Lines:
        self.collecting.set()
        if self.hold is not None:
            assert self.hold.wait(60), "the test never released the chunk"
        usage = {"prompt_tokens": self.per_row, "total_tokens": self.per_row}
        ok = b"".join(outputs.ok_line(r["custom_id"], {"worker": self.name, "usage": usage})
                      for r in chunk.rows)
        n = len(chunk.rows)
        return ok, b"", n, 0, Tokens(self.per_row * n)

    def cancel(self, chunk: Chunk | None) -> None:
        pass


class FaultyRunner(ScriptedRunner):
    """As ScriptedRunner, but the first time it computes ``faulty`` that line fails on
    the server's side: an error line (500), noted in the chunk's ``faults``, as the
    real runners do."""

    def __init__(self, name: str, faulty: str) -> None:
        super().__init__(name, per_row=1)
        self.faulty, self.faulted = faulty, False

    def collect(self, chunk: Chunk) -> Lines:
        if self.faulted or self.faulty not in [r["custom_id"] for r in chunk.rows]:
            return super().collect(chunk)
        self.faulted = True
        good = Chunk([r for r in chunk.rows if r["custom_id"] != self.faulty], [])
        ok, _, n, _, tokens = super().collect(good)
        chunk.faults.append(f"{self.faulty}: inference failed: device lost")
        err = outputs.error_response_line(self.faulty, 500, "inference failed: device lost",
                                          "server_error", "server_error")
        return ok, err, n, 1, tokens


@pytest.fixture
def pctx(own_settings: Settings) -> Iterator[Context]:
    """A database of its own: no stack's workers or janitor touch these shards."""
    c = Context(own_settings.model_copy(update={"lease_seconds": 60.0}))
    yield c
    c.close()


def worker_ctx(ctx: Context, chunk_rows: int) -> Context:
    return Context(ctx.settings.model_copy(update={"chunk_rows": chunk_rows}))


def make_batch(ctx: Context, rows: int = ROWS, **shard: Any) -> tuple[str, str]:
    """A batch in progress with one shard of ``rows`` requests; (batch id, shard id)."""
    batch_id = new_id("batch_")
    ctx.store.put_bytes(keys.shard_input(batch_id, 0), shard_bytes(
        [(i + 1, f"req-{i}", orjson.dumps({"input": "x"}).decode(), i) for i in range(rows)]))
    _, (sid,) = batch_rows(ctx, [{"rows": rows, "object_key": keys.shard_input(batch_id, 0),
                                  **shard}], id=batch_id, file_key="files/none", total=rows)
    return batch_id, sid


def output_lines(ctx: Context, b: Batch) -> list[dict[str, Any]]:
    if b.output_file_id is None:
        return []
    with ctx.db.session() as s:
        f = s.get(File, b.output_file_id)
        assert f is not None
        key = f.object_key
    return [json.loads(x) for x in ctx.store.get_bytes(key).splitlines() if x]


def test_a_late_writer_never_replaces_a_committed_part(pctx: Context) -> None:
    batch_id, sid = make_batch(pctx)
    late = ScriptedRunner("late", per_row=2, hold=threading.Event())
    holder = ScriptedRunner("holder", per_row=1)
    ctx_late, ctx_holder = worker_ctx(pctx, 4), worker_ctx(pctx, 3)
    try:
        with ThreadPoolExecutor(1) as pool:
            # The first worker claims the shard and computes chunk 0 (rows 0-3) ...
            first = pool.submit(process_shard, ctx_late, lambda *_: late, sid, "late")
            assert late.collecting.wait(30), "the first worker never reached its chunk"
            # ... while its lease lapses (a long pause: GC, a stalled network) ...
            with pctx.db.session() as s:
                s.execute(update(Shard).where(Shard.id == sid)
                          .values(lease_expires_at=time.time() - 1))
            # ... and another worker, with chunks of 3 rows, claims and finishes it.
            res = process_shard(ctx_holder, lambda *_: holder, sid, "holder")
            assert (res.outcome, res.finalize) == (ShardOutcome.DONE, True)
            # Only now does the first worker write chunk 0; its checkpoint is fenced.
            assert late.hold is not None
            late.hold.set()
            assert first.result(timeout=60).outcome == ShardOutcome.FENCED
    finally:
        ctx_late.close()
        ctx_holder.close()

    sh = shard_row(pctx, sid)
    assert (sh.status, sh.chunks_done, sh.rows_done, sh.attempt) == (ShardStatus.DONE, 4,
                                                                     ROWS, 2)
    assert sh.part_attempts == {"0": 2, "1": 2, "2": 2, "3": 2}
    # The late part was written, beside the committed one, not over it.
    assert b"late" in pctx.store.get_bytes(keys.output_part(batch_id, 0, 0, "ok", 1))
    assert b"holder" in pctx.store.get_bytes(keys.output_part(batch_id, 0, 0, "ok", 2))

    finalize.finalize_batch(pctx, batch_id)
    b = row(pctx, Batch, batch_id)
    assert b.status == BatchStatus.COMPLETED, b.errors
    out = output_lines(pctx, b)
    ids = Counter(x["custom_id"] for x in out)
    assert ids == Counter(f"req-{i}" for i in range(ROWS)), "lost or duplicated results"
    assert {x["response"]["body"]["worker"] for x in out} == {"holder"}
    with pctx.db.session() as s:
        usage = repo.shard_sums(s, [batch_id])[batch_id]
    assert usage.prompt_tokens == sum(x["response"]["body"]["usage"]["prompt_tokens"]
                                      for x in out)


def test_a_missing_committed_part_fails_the_batch(pctx: Context) -> None:
    batch_id, sid = make_batch(pctx)
    wctx = worker_ctx(pctx, 4)
    try:
        res = process_shard(wctx, lambda *_: ScriptedRunner("w", 1), sid, "w")
    finally:
        wctx.close()
    assert res.outcome == ShardOutcome.DONE
    sh = shard_row(pctx, sid)
    assert sh.chunks_done == 3
    pctx.store.delete(keys.output_part(batch_id, 0, 1, "ok", repo.part_attempt(sh, 1)))

    finalize.finalize_batch(pctx, batch_id)
    b = row(pctx, Batch, batch_id)
    assert b.status == BatchStatus.FAILED
    assert b.errors is not None and [e["code"] for e in b.errors] == ["output_part_missing"]
    assert "chunk 1 of shard 0" in b.errors[0]["message"]


def test_chunks_committed_before_attempts_were_recorded_use_the_old_keys(
        pctx: Context) -> None:
    """Chunk 0 was committed under the old layout; chunk 1 by attempt 3, whose key is
    read and not the stale old-layout object beside it."""
    batch_id, sid = make_batch(pctx, rows=2, status=ShardStatus.DONE, attempt=3,
                               chunks_done=2, rows_done=2, completed=2,
                               part_attempts={"1": 3})

    def line(i: int, who: str) -> bytes:
        return outputs.ok_line(f"req-{i}", {"worker": who})

    for chunk, attempt, who in [(0, None, "old"), (1, None, "stale"), (1, 3, "new")]:
        pctx.store.put_bytes(keys.output_part(batch_id, 0, chunk, "ok", attempt),
                             line(chunk, who))
        pctx.store.put_bytes(keys.output_part(batch_id, 0, chunk, "err", attempt), b"")
    finalize.finalize_batch(pctx, batch_id)
    b = row(pctx, Batch, batch_id)
    assert b.status == BatchStatus.COMPLETED, b.errors
    assert [(x["custom_id"], x["response"]["body"]["worker"])
            for x in output_lines(pctx, b)] == [("req-0", "old"), ("req-1", "new")]


def test_a_line_that_failed_on_the_server_s_side_is_computed_again(pctx: Context) -> None:
    batch_id, sid = make_batch(pctx)
    runner = FaultyRunner("w", faulty="req-5")
    wctx = worker_ctx(pctx, 4)  # chunks of rows 0-3, 4-7 (req-5's), 8-9
    try:
        first = process_shard(wctx, lambda *_: runner, sid, "w")
        assert first.outcome == ShardOutcome.RETRY and first.retry_in_s > 0
        sh = shard_row(pctx, sid)
        assert (sh.status, sh.chunks_done, sh.rows_done, sh.failed) == (
            ShardStatus.QUEUED, 1, 4, 0)
        assert sh.error is not None and "req-5: inference failed" in sh.error
        again = process_shard(wctx, lambda *_: runner, sid, "w")
        assert (again.outcome, again.finalize) == (ShardOutcome.DONE, True)
    finally:
        wctx.close()
    sh = shard_row(pctx, sid)
    assert (sh.completed, sh.failed, sh.part_attempts) == (ROWS, 0, {"0": 1, "1": 2, "2": 2})
    finalize.finalize_batch(pctx, batch_id)
    b = row(pctx, Batch, batch_id)
    assert b.status == BatchStatus.COMPLETED, b.errors
    ids = Counter(x["custom_id"] for x in output_lines(pctx, b))
    assert ids == Counter(f"req-{i}" for i in range(ROWS)), "lost or duplicated results"
    with pctx.db.session() as s:
        f = s.get(File, b.error_file_id) if b.error_file_id else None
        errors = pctx.store.get_bytes(f.object_key) if f is not None else b""
        usage = repo.shard_sums(s, [batch_id])[batch_id]
    assert errors.strip() == b"" and usage.prompt_tokens == ROWS  # billed once per line
