"""Fair dispatch of batch shards (jobs/batches/fairshare.py) against real PostgreSQL, Redis and
S3: concurrent dispatchers fill a lane exactly, the round and the projects' weights
hold across dispatchers, and, through a stack with a worker, a small batch of one
project runs while another project's large batch is still running.

The bound of the stack test follows from the dispatcher's rules. With W worker
slots on the lane, a margin M and equal weights, when project B's batch of n_B
shards arrives the lane holds W running shards of A and M queued ones. Each time a
shard ends one place frees and the round gives it to A then B, A then B: so at most
M + (W - 1) + n_B of A's shards start after B's shards are inserted and before B's
last shard starts (the W - 1: workers racing for the queue), and at most M + W
before B's first. Under FIFO every A shard still queued starts first.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select, update

from jobs.batches import fairshare
from jobs.core.context import Context
from jobs.core.schema import DispatchDeficit, Shard, Tenant, new_id
from jobs.core.settings import Settings
from jobs.core.status import ShardStatus
from jobs.fleet import heartbeats
from jobs.tenants import auth
from tests.conftest import AWS_ENV, free_port
from tests.factories import batch_rows, sent
from tests.helpers import emb_line, jsonl, lines, upload, wait


@pytest.fixture
def fctx(own_settings: Settings) -> Iterator[Context]:
    """A database and Redis DB of its own: no other stack's janitor or worker may
    dispatch or take these shards."""
    c = Context(own_settings.model_copy(update={"shard_rows": 100}))
    yield c
    c.close()


def project(ctx: Context, name: str, weight: int = 1) -> str:
    tenant_id, _ = auth.create_tenant(ctx, f"{name}-{new_id('')}")
    with ctx.db.session() as s:
        s.execute(update(Tenant).where(Tenant.id == tenant_id).values(weight=weight))
    return tenant_id


def waiting_batch(ctx: Context, tenant_id: str, n: int, rows: int = 100) -> list[str]:
    """A batch in progress whose ``n`` shards wait for the dispatcher."""
    return batch_rows(ctx, [{"rows": rows}] * n, tenant_id=tenant_id)[1]


def announce_slots(ctx: Context, n: int, lanes: list[str]) -> None:
    """``n`` model workers' heartbeats (as workers.process.heartbeat writes them)."""
    for i in range(n):
        heartbeats.write(ctx.redis, f"test-worker-{i}", {
            "name": f"test-worker-{i}", "lanes": lanes, "breaker": "closed", "models": []},
            ttl_s=60)


def owner(ids: list[str], a: list[str]) -> str:
    return "".join("A" if sid in a else "B" for sid in ids)


def finish(ctx: Context, ids: list[str]) -> None:
    with ctx.db.session() as s:
        s.execute(update(Shard).where(Shard.id.in_(ids)).values(status=ShardStatus.DONE))


def test_concurrent_dispatchers_fill_the_lane_exactly(fctx: Context) -> None:
    """Twelve dispatchers, each with its own connections (as processes have), race for
    a lane with room for 6 (5 slots + margin 1): 6 shards are sent, once each, shared
    between the projects; when 2 end, 2 more, whoever asks."""
    a = waiting_batch(fctx, project(fctx, "a"), 10)
    b = waiting_batch(fctx, project(fctx, "b"), 10)
    announce_slots(fctx, 5, ["batch"])
    ctxs = [Context(fctx.settings) for _ in range(12)]

    def race() -> list[str]:
        got: list[list[str]] = []
        start = threading.Barrier(len(ctxs))

        def one(c: Context) -> None:
            start.wait()
            got.append(fairshare.dispatch(c, "batch"))

        threads = [threading.Thread(target=one, args=(c,)) for c in ctxs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return [sid for ids in got for sid in ids]

    try:
        first = race()
        assert len(first) == 6 and len(set(first)) == 6
        assert sorted(owner(first, a)) == sorted("AAABBB")
        assert sorted(sent(fctx)) == sorted(first)
        finish(fctx, first[:2])
        second = race()
        assert len(second) == 2 and not set(second) & set(first)
        assert sorted(sent(fctx)) == sorted(first + second)
        with fctx.db.session() as s:
            dispatched = s.scalars(select(Shard.id).where(Shard.dispatched_at.is_not(None)))
            assert sorted(dispatched) == sorted(first + second)
        assert fairshare.dispatch(fctx, "batch") == []  # full
        assert fairshare.dispatch(fctx, "flex") == []  # nothing waits there
        assert len(b) == 10
    finally:
        for c in ctxs:
            c.close()


def test_the_round_and_weights_hold_across_dispatchers(fctx: Context) -> None:
    """Project A weighs 2, B 1; one place at a time (no worker: the margin), each
    dispatch by a new context (a restarted process): A, A, B, ... from the round kept
    in the database. A project that runs dry leaves the round."""
    a = waiting_batch(fctx, project(fctx, "a", weight=2), 6)
    b_id = project(fctx, "b")
    b = waiting_batch(fctx, b_id, 2)
    order = []
    for _ in range(8):
        c = Context(fctx.settings)
        try:
            (sid,) = fairshare.dispatch(c, "batch")
        finally:
            c.close()
        order.append(sid)
        finish(fctx, [sid])
    assert owner(order, a) == "AABAABAA"
    assert [x for x in order if x in a] == a  # shard order within a batch
    with fctx.db.session() as s:
        left = dict(s.execute(select(DispatchDeficit.tenant_id, DispatchDeficit.position)
                              .where(DispatchDeficit.lane == "batch")).tuples().all())
    assert left == {} and set(order) == set(a + b)  # both ran dry


def test_fifo_mode_sends_everything_at_once(fctx: Context) -> None:
    """Fair dispatch off: whatever waits (e.g. from before the switch) is sent, oldest
    batch first, however full the lane."""
    fifo = Context(fctx.settings.model_copy(update={"fair_dispatch": False}))
    try:
        a = waiting_batch(fctx, project(fctx, "a"), 3)
        b = waiting_batch(fctx, project(fctx, "b"), 2)
        assert fairshare.dispatch(fifo, "batch") == a + b
        assert sent(fctx) == a + b
    finally:
        fifo.close()


# Through a stack: a model worker, the control worker's janitor, the API. ------------

N_A, N_B, SHARD = 3000, 1000, 100


@pytest.fixture
def fair_stack(own_settings: Settings, s3_endpoint: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A stack of its own (database, Redis DB): one model worker, small shards."""
    from cli.stack import Stack

    st = own_settings.model_copy(update={
        "shard_rows": SHARD, "chunk_rows": 50, "janitor_interval_s": 1.0,
        "chat_model": "", "fair_dispatch": True, "dispatch_margin": 1,
        "data_dir": tmp_path_factory.mktemp("fair")})
    stack = Stack(st, port=free_port(), extra_env={**AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint},
                  log_dir=tmp_path_factory.mktemp("fairlogs"), model_workers=1)
    stack.start()
    yield stack
    stack.stop()


def shard_times(ctx: Context, batch_id: str) -> list[Shard]:
    with ctx.db.session() as s:
        rows = list(s.scalars(select(Shard).where(Shard.batch_id == batch_id)
                              .order_by(Shard.index)))
        s.expunge_all()
    return rows


@pytest.mark.slow
def test_a_small_batch_runs_beside_a_large_one_within_the_bound(fair_stack) -> None:  # type: ignore[no-untyped-def]
    """A submits 30 shards; once they run, B submits 1,000 rows (10 shards). With one
    worker slot and margin 1: at most M + W - 1 + n_B = 11 of A's shards start after
    B's shards are inserted and before B's last starts, at most M + W = 2 before B's
    first; B completes while A still runs (A's last shard starts after B's last
    ended). A is then cancelled: its waiting shards end without ever being sent, and
    its output and error files hold every custom_id once."""
    from openai import OpenAI

    ctx = Context(fair_stack.settings)
    try:
        clients = {}
        for name in ("a", "b"):
            _, key = auth.create_tenant(ctx, f"fair-{name}-{new_id('')}")
            clients[name] = OpenAI(base_url=fair_stack.base_url + "/v1", api_key=key,
                                   _strict_response_validation=True, max_retries=0,
                                   timeout=120)
        sdk_a, sdk_b = clients["a"], clients["b"]
        fa = upload(sdk_a, jsonl([emb_line(f"a{i}", f"alpha row {i}") for i in range(N_A)]))
        big = sdk_a.batches.create(input_file_id=fa.id, endpoint="/v1/embeddings",
                                   completion_window="24h")
        fb = upload(sdk_b, jsonl([emb_line(f"b{i}", f"beta row {i}") for i in range(N_B)]))
        deadline = time.monotonic() + 300
        while not any(sh.claimed_at for sh in shard_times(ctx, big.id)):
            assert time.monotonic() < deadline, "A's shards never started"
            time.sleep(0.2)
        small = sdk_b.batches.create(input_file_id=fb.id, endpoint="/v1/embeddings",
                                     completion_window="24h")
        done_b = wait(sdk_b, small.id, timeout=600)
        assert done_b.status == "completed" and done_b.request_counts.completed == N_B
        assert {x["custom_id"] for x in lines(sdk_b, done_b.output_file_id)} == {
            f"req-b{i}" for i in range(N_B)}

        a_shards, b_shards = shard_times(ctx, big.id), shard_times(ctx, small.id)
        n_b, w, m = len(b_shards), 1, fair_stack.settings.dispatch_margin
        assert n_b == N_B // SHARD
        arrival = min(sh.created_at or 0 for sh in b_shards)
        b_first = min(sh.claimed_at or 0 for sh in b_shards)
        b_last = max(sh.claimed_at or 0 for sh in b_shards)
        b_end = max(sh.updated_at for sh in b_shards)
        a_starts = sorted(sh.claimed_at for sh in a_shards if sh.claimed_at)
        before_first = [t for t in a_starts if arrival < t < b_first]
        before_last = [t for t in a_starts if arrival < t < b_last]
        report = {"a_started_before_b_first": len(before_first),
                  "a_started_before_b_last": len(before_last), "n_b": n_b}
        print("fairness:", json.dumps(report))
        assert len(before_first) <= m + w, report
        assert len(before_last) <= m + (w - 1) + n_b, report
        assert len([sh for sh in a_shards if not sh.claimed_at or sh.claimed_at > b_end]) > 0, \
            "A's batch had finished before B completed"

        sdk_a.batches.cancel(big.id)
        ended = wait(sdk_a, big.id, timeout=300)
        assert ended.status == "cancelled"
        a_shards = shard_times(ctx, big.id)
        never_sent = [sh for sh in a_shards if sh.dispatched_at is None]
        assert never_sent and all(sh.status == ShardStatus.CANCELLED and sh.attempt == 0
                                  for sh in never_sent)
        out = lines(sdk_a, ended.output_file_id) + lines(sdk_a, ended.error_file_id)
        ids = [x["custom_id"] for x in out]
        assert sorted(ids) == sorted(f"req-a{i}" for i in range(N_A))
        assert ended.request_counts.completed == sum(sh.completed for sh in a_shards)
    finally:
        ctx.close()
