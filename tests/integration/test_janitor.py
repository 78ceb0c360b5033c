"""The janitor's sweep against real PostgreSQL and Redis: lapsed leases are handed
back with a message on the lane queue, used-up attempts fail the shard, a send that
fails because the broker is down is repeated by the next sweep that reaches it,
stranded shards are sent again only while their queue is empty, and shards waiting
for the fair dispatcher are dispatched (never re-sent as stranded), or cancelled
unsent."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from jobs.batches import fairshare, janitor, service
from jobs.batches.outputs import Tokens
from jobs.core.context import Context
from jobs.core.dispatch import TASK_FINALIZE, TASK_VALIDATE, Dispatcher, make_celery
from jobs.core.schema import Batch, Shard
from jobs.core.settings import Settings
from jobs.core.status import BatchStatus, ShardStatus
from jobs.fleet import heartbeats
from tests.conftest import free_port
from tests.factories import make_batch, messages, sent, shard_row


@pytest.fixture
def jctx(own_settings: Settings) -> Iterator[Context]:
    """A database and a Redis DB of its own: the sweep acts on every batch it finds,
    and other tests' control workers sweep the session's database and consume the
    session's control queue."""
    c = Context(own_settings.model_copy(update={"max_shard_attempts": 3,
                                                "stranded_shard_s": 60}))
    yield c
    c.close()


def test_a_lapsed_shard_of_a_cancelled_batch_ends_it_without_a_worker(jctx) -> None:  # type: ignore[no-untyped-def]
    """Its worker was killed while the batch was being cancelled: the shard is
    cancelled (never sent again) and the batch's finalize is sent, so the batch ends
    without waiting for a worker to come back."""
    past = time.time() - 1
    (lapsed,) = make_batch(jctx, [{"status": ShardStatus.RUNNING, "attempt": 1,
                                   "lease_token": "a", "lease_expires_at": past}],
                           status=BatchStatus.CANCELLING)
    batch_id = lapsed.rsplit(".", 1)[0]
    rep = janitor.sweep(jctx)
    assert rep.requeued == [] and rep.finalize == {batch_id}
    assert shard_row(jctx, lapsed).status == ShardStatus.CANCELLED
    assert sent(jctx) == []
    assert (TASK_FINALIZE, batch_id) in messages(jctx, "control")


def test_lapsed_lease_is_handed_back_and_sent(jctx) -> None:  # type: ignore[no-untyped-def]
    past, future = time.time() - 1, time.time() + 60
    lapsed, held, spent, moving = make_batch(jctx, [
        {"status": ShardStatus.RUNNING, "attempt": 1, "lease_token": "a", "lease_expires_at": past},
        {"status": ShardStatus.RUNNING, "attempt": 1, "lease_token": "b",
         "lease_expires_at": future},
        # Two attempts in a row committed nothing, and neither did this third one.
        {"status": ShardStatus.RUNNING, "attempt": 3, "stalls": 2, "claimed_chunks": 1,
         "chunks_done": 1, "lease_token": "c", "lease_expires_at": past},
        # Killed seven times, but this attempt committed a chunk: never given up on.
        {"status": ShardStatus.RUNNING, "attempt": 7, "stalls": 2, "claimed_chunks": 1,
         "chunks_done": 2, "lease_token": "d", "lease_expires_at": past},
    ])
    rep = janitor.sweep(jctx)
    assert sorted(rep.requeued) == sorted([lapsed, moving]) and rep.failed == [spent]
    assert shard_row(jctx, lapsed).status == ShardStatus.QUEUED
    assert shard_row(jctx, lapsed).lease_token is None
    assert shard_row(jctx, held).status == ShardStatus.RUNNING
    assert shard_row(jctx, spent).status == ShardStatus.FAILED
    assert "gave up after 3 attempts in a row" in (shard_row(jctx, spent).error or "")
    assert sorted(sent(jctx)) == sorted([lapsed, moving])


def test_claims_count_attempts_in_a_row_without_progress(jctx) -> None:  # type: ignore[no-untyped-def]
    from jobs.batches import queries as repo

    (sid,) = make_batch(jctx, [{"status": ShardStatus.QUEUED}])

    def claim(token: str) -> Shard:
        with jctx.db.session() as s:
            sh = repo.claim_shard(s, sid, token, "w", ttl_s=-1)  # lapses at once
            assert sh is not None
            s.expunge(sh)
            return sh

    def commit(sh: Shard, chunk: int) -> None:
        with jctx.db.session() as s:
            assert sh.lease_token is not None
            assert repo.checkpoint(s, sid, sh.lease_token, sh.attempt, chunk, 10, 10, 0,
                                   Tokens(5), ttl_s=-1)

    assert claim("t1").stalls == 0  # first attempt
    t2 = claim("t2")
    assert t2.stalls == 1  # t1 died before committing
    commit(t2, 1)
    assert claim("t3").stalls == 0  # t2 moved the checkpoint
    assert claim("t4").stalls == 1
    with jctx.db.session() as s:  # t4's model failed: it gives the shard back
        assert repo.release_shard(s, sid, "t4", ShardStatus.QUEUED, "broken model",
                                  not_its_fault=True)
    sh = claim("t5")
    assert (sh.stalls, sh.attempt) == (0, 5)


def test_a_send_lost_to_a_broker_outage_is_repeated(jctx) -> None:  # type: ignore[no-untyped-def]
    (lapsed,) = make_batch(jctx, [
        {"status": ShardStatus.RUNNING, "attempt": 1, "lease_token": "a",
         "lease_expires_at": time.time() - 1}])
    jctx.redis.rpush("batch", b"someone else's message")  # the queue is not empty
    down = Context(jctx.settings.model_copy(
        update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"}))
    down.dispatcher.app.conf.broker_connection_max_retries = 0
    down.dispatcher.app.conf.broker_transport_options = {"max_retries": 0}
    with pytest.raises(Exception):  # noqa: B017,PT011 - whatever the client raises
        janitor.sweep(down)
    down.close()
    sh = shard_row(jctx, lapsed)
    assert sh.status == ShardStatus.QUEUED and sh.updated_at == 0
    rep = janitor.sweep(jctx)  # the broker is back: sent although the queue is not empty
    assert rep.requeued == [lapsed]
    assert sent(jctx)[-1] == lapsed
    assert janitor.sweep(jctx).requeued == []  # and only once


def test_stranded_shards_are_sent_only_while_their_queue_is_empty(jctx) -> None:  # type: ignore[no-untyped-def]
    old = time.time() - 120
    stranded, recent = make_batch(jctx, [
        {"status": ShardStatus.QUEUED, "updated_at": old},
        {"status": ShardStatus.QUEUED, "updated_at": time.time()}])
    jctx.redis.rpush("batch", b"pending")
    assert janitor.sweep(jctx).requeued == []  # its message may still be in the queue
    jctx.redis.delete("batch")
    assert janitor.sweep(jctx).requeued == [stranded]
    assert sent(jctx) == [stranded] and recent not in sent(jctx)


def test_lost_control_tasks_are_sent_again(jctx) -> None:  # type: ignore[no-untyped-def]
    """A batch that sat still with all shards finished never got finalized, and one
    still validating long after it was created lost its validate task."""
    old = time.time() - 120
    (done,) = make_batch(jctx, [{"status": ShardStatus.DONE, "updated_at": old}])
    (fresh,) = make_batch(jctx, [{"status": ShardStatus.DONE, "updated_at": time.time()}])
    (unfinished,) = make_batch(jctx, [{"status": ShardStatus.QUEUED, "updated_at": old},
                                      {"status": ShardStatus.DONE, "updated_at": old}])[:1]
    (stuck,) = make_batch(jctx, [], status=BatchStatus.VALIDATING, created_at=int(old))
    (young,) = make_batch(jctx, [], status=BatchStatus.VALIDATING)
    jctx.redis.delete("batch")
    rep = janitor.sweep(jctx)
    batch_of = {done: done.rsplit(".", 1)[0]}
    assert rep.finalize == {batch_of[done]} and rep.validate == {stuck}
    assert messages(jctx, "control") == [(TASK_VALIDATE, stuck),
                                         (TASK_FINALIZE, batch_of[done])]
    assert fresh and unfinished and young  # left alone: moving, unfinished, just created
    janitor.sweep(jctx)  # the copies are still queued: nothing is sent twice
    assert len(messages(jctx, "control")) == 2


def waiting_batch(ctx: Context, n: int, **batch: object) -> list[str]:
    """A batch in progress whose shards wait for the fair dispatcher."""
    return make_batch(ctx, [{"status": ShardStatus.QUEUED, "dispatched_at": None,
                             "updated_at": time.time() - 600}] * n, **batch)


def announce_worker(ctx: Context, name: str, lanes: list[str]) -> None:
    """A model worker's heartbeat, as workers.process.heartbeat writes it: one slot on its lanes."""
    heartbeats.write(ctx.redis, name, {"name": name, "lanes": lanes, "breaker": "closed",
                                         "models": []}, ttl_s=30)


def test_waiting_shards_are_dispatched_by_the_sweep_never_resent_as_stranded(jctx) -> None:  # type: ignore[no-untyped-def]
    """Untouched for longer than stranded_shard_s, on an empty queue: a waiting shard has
    no message to lose. The sweep sends as many as the lane has room for: its live
    worker slots plus the margin (1), counting what is sent and not finished."""
    s0, s1, s2 = waiting_batch(jctx, 3)
    rep = janitor.sweep(jctx)
    assert rep.requeued == [] and rep.dispatched == [s0]  # no worker yet: the margin
    assert sent(jctx) == [s0] and shard_row(jctx, s0).dispatched_at is not None
    assert shard_row(jctx, s1).dispatched_at is None
    assert janitor.sweep(jctx).dispatched == []  # the queue is full
    announce_worker(jctx, "w1", ["batch"])
    announce_worker(jctx, "w2", ["flex"])  # another lane's slot makes no room here
    assert janitor.sweep(jctx).dispatched == [s1]
    with jctx.db.session() as s:
        s.execute(update(Shard).where(Shard.id == s0).values(status=ShardStatus.DONE))
    assert janitor.sweep(jctx).dispatched == [s2]
    assert sent(jctx) == [s0, s1, s2]
    assert janitor.sweep(jctx).dispatched == []  # nothing left waiting


def test_cancel_and_expiry_end_waiting_shards_without_sending_them(jctx) -> None:  # type: ignore[no-untyped-def]
    cancelled = waiting_batch(jctx, 2)
    expired = waiting_batch(jctx, 2, expires_at=int(time.time()) - 1)
    batch_id = cancelled[0].rsplit(".", 1)[0]
    with jctx.db.session() as s:
        b = s.get(Batch, batch_id)
        assert b is not None
        tenant = b.tenant_id
    service.cancel_batch(jctx, tenant, batch_id)
    rep = janitor.sweep(jctx)
    assert rep.dispatched == [] and sent(jctx) == []
    assert rep.expired == [expired[0].rsplit(".", 1)[0]]
    for sid in cancelled + expired:
        assert shard_row(jctx, sid).status == ShardStatus.CANCELLED
        assert shard_row(jctx, sid).dispatched_at is None
    assert {arg for _, arg in messages(jctx, "control")} == {
        batch_id, expired[0].rsplit(".", 1)[0]}  # both finalized at once


def test_a_dispatch_lost_to_a_broker_outage_is_sent_by_the_next_sweep(jctx) -> None:  # type: ignore[no-untyped-def]
    """Redis down before the choice (no heartbeats to count): nothing is taken, the
    shards wait. The broker lost between the commit and the send: the shard's turn is
    taken, and the next sweep that reaches the broker sends it although its queue is
    not empty."""
    first, second = waiting_batch(jctx, 2)
    dead = jctx.settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    down = Context(dead)
    with pytest.raises(Exception):  # noqa: B017,PT011 - whatever the client raises
        fairshare.dispatch(down, "batch")
    down.close()
    assert shard_row(jctx, first).dispatched_at is None
    lost = Context(jctx.settings)  # heartbeats readable, the broker not
    lost.dispatcher = Dispatcher(make_celery(dead))
    lost.dispatcher.app.conf.broker_connection_max_retries = 0
    lost.dispatcher.app.conf.broker_transport_options = {"max_retries": 0}
    with pytest.raises(Exception):  # noqa: B017,PT011 - whatever the client raises
        fairshare.dispatch(lost, "batch")
    lost.close()
    sh = shard_row(jctx, first)
    assert sh.dispatched_at is not None and sh.updated_at == 0  # its turn was taken
    assert shard_row(jctx, second).dispatched_at is None
    jctx.redis.rpush("batch", b"someone else's message")  # the queue is not empty
    rep = janitor.sweep(jctx)
    assert rep.requeued == [first] and rep.dispatched == []  # the lane is full
    assert sent(jctx) == [first]
    assert janitor.sweep(jctx).requeued == []  # and only once
