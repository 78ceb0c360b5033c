"""A model worker's life beside its work, as real Celery processes of the ``fstack``
(tests/integration/conftest.py): one that cannot load what it was configured to hold
exits at once with status 78 (EX_CONFIG) and says why, instead of living on without
ever serving (no heartbeat would ever start, the API would count no worker while the
process looked alive, and no orchestrator would restart it); a stop (SIGTERM) and a
batch's cancel end a long generation within seconds, not when it runs out."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.schema import Shard
from tests.helpers import chat_line, jsonl, upload, wait

pytestmark = pytest.mark.slow


def test_a_worker_whose_configured_model_cannot_load_exits_saying_why(
        fstack: Any, workers: Any) -> None:
    proc = workers("unservable", "realtime,batch", INFERQ_CHAT_MODEL="no-such-chat-model",
                   INFERQ_WORKER_HEARTBEAT_S="1")
    assert proc.wait(180) == 78
    log = fstack.log_path("worker-unservable").read_text()
    assert "cannot serve what it was configured for, exiting (status 78)" in log, log[-3000:]
    assert "model 'no-such-chat-model' could not be loaded" in log, log[-3000:]
    assert "inferq models import" in log


SMOL = "SmolLM2-135M-Instruct"
NO_END = {"0": -100, "1": -100, "2": -100}  # <|endoftext|>, <|im_start|>, <|im_end|>


def _long_batch(fsdk: Any) -> Any:
    """One chat row that generates until 5,000 tokens (its end tokens are banned): on
    this CPU minutes of work, in one chunk."""
    row = chat_line("long", "Count from 1 upwards, one number a line.", SMOL, max_tokens=5000)
    row["body"]["logit_bias"] = NO_END
    return fsdk.batches.create(input_file_id=upload(fsdk, jsonl([row])).id,
                               endpoint="/v1/chat/completions", completion_window="24h")


def _generating(ctx: Context, batch_id: str, attempt: int, timeout: float = 240) -> Shard:
    """The batch's shard once its ``attempt``-th claim has run a few seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with ctx.db.session() as s:
            sh = s.scalars(select(Shard).where(Shard.batch_id == batch_id)).first()
            if sh is not None:
                s.expunge(sh)
        if sh is not None and sh.claimed_at and sh.attempt >= attempt:
            time.sleep(3)  # well into its generation
            return sh
        assert time.monotonic() < deadline, "the shard never started"
        time.sleep(0.2)


def test_a_stop_and_a_cancel_end_a_long_generation_within_seconds(
        fstack: Any, fsdk: Any, fctx: Context, workers: Any) -> None:
    """SIGTERM: the chunk in flight gets INFERQ_DRAIN_S (here 2 s), then its rows leave
    the engine and the shard is handed back from its checkpoint; the worker exits.
    Cancel: the batch's rows leave the engine of the worker now running it within a
    check (1 s) and the batch is cancelled, without waiting for the generation."""
    b = _long_batch(fsdk)
    first = workers("drain", "batch", INFERQ_DRAIN_S="2")
    sh = _generating(fctx, b.id, 1)
    t0 = time.monotonic()
    os.kill(first.pid, signal.SIGTERM)  # as an orchestrator stops it: its main process
    first.wait(60)
    stopped_in = time.monotonic() - t0
    with fctx.db.session() as s:
        back = s.get(Shard, sh.id)
        assert back is not None
        assert (back.status, back.chunks_done) == ("queued", 0), (
            back.status, back.chunks_done, back.worker, first.returncode)
    assert stopped_in < 20, stopped_in  # not the minutes its generation needs

    workers("cancel", "batch")
    _generating(fctx, b.id, 2)
    t0 = time.monotonic()
    fsdk.batches.cancel(b.id)
    done = wait(fsdk, b.id, timeout=60)
    assert done.status == "cancelled", done
    assert time.monotonic() - t0 < 20
