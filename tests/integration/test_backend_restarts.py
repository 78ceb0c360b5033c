"""Failure matrix cases 4 and 5 mid-batch: the broker (Redis) or the database
(PostgreSQL) restarts while shards run.

The module starts its own redis-server (AOF on, a TCP port of its own) and its own
PostgreSQL (pgserver), never the machine's, and a whole stack on them: API,
control worker and two model workers. A backend is stopped while shards run and
started again on the same data dir. The workers must recover by themselves (the
same processes, none restarted), the batch must complete with every custom_id
exactly once, and recomputation must stay within one chunk per shard that was
running when the backend went away.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.core.context import Context
from tests.conftest import CHUNK
from tests.helpers import embedding_lines, exactly_once, jsonl, recomputed, shards, upload, wait
from tests.polling import until
from tests.stacks import context_of, running_stack, sdk_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rstack(settings, broker, database, s3_endpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    with running_stack(settings, s3_endpoint, tmp_path_factory.mktemp("rlogs"),
                       model_workers=0, redis_url=broker.url, database_url=database.url,
                       chunk_rows=CHUNK, shard_rows=400, lease_seconds=3.0,
                       janitor_interval_s=1.0, stranded_shard_s=5.0, chat_model="",
                       data_dir=tmp_path_factory.mktemp("d")) as stack:
        yield stack


@pytest.fixture(scope="module")
def rctx(rstack) -> Iterator[Context]:  # type: ignore[no-untyped-def]
    with context_of(rstack) as c:
        yield c


@pytest.fixture
def rsdk(rstack):  # type: ignore[no-untyped-def]
    return sdk_of(rstack)


@pytest.fixture
def two_workers(rstack, broker) -> Iterator[list[Any]]:  # type: ignore[no-untyped-def]
    start = time.time() - 1
    procs = [rstack.start_model_worker(f"r{i}-{time.monotonic_ns()}", "batch")
             for i in range(2)]
    until(lambda: len(heartbeats(broker.url, since=start)) >= 2, timeout=120,
             what="both workers up")
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def heartbeats(url: str, since: float = 0) -> set[str]:
    """Workers that announced themselves after ``since``."""
    import redis

    r = redis.Redis.from_url(url)
    infos = [json.loads(r.get(k) or "{}") for k in r.scan_iter("inferq:workers:*")]
    return {i["name"] for i in infos if i.get("at", 0) > since}


def start_batch(rsdk, rctx, n: int) -> tuple[Any, list[dict[str, Any]], int]:  # type: ignore[no-untyped-def]
    """A batch of ``n`` rows, returned once shards are running with chunks committed;
    also how many shards were running at that moment."""
    rows = embedding_lines(n)
    b = rsdk.batches.create(input_file_id=upload(rsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    until(lambda: sum(s.chunks_done for s in shards(rctx, b.id)) >= 4
             and any(s.status == "running" for s in shards(rctx, b.id)),
             what="shards in progress")
    return b, rows, sum(s.status == "running" for s in shards(rctx, b.id))


def finish(rctx, rsdk, b, rows, running: int, procs: list[Any]) -> None:  # type: ignore[no-untyped-def]
    b = wait(rsdk, b.id, timeout=300)
    assert b.status == "completed" and b.request_counts.completed == len(rows), b
    exactly_once(rsdk, b, rows)
    assert all(p.poll() is None for p in procs), "a worker died instead of recovering"
    assert 0 <= recomputed(rctx, b.id, len(rows)) <= CHUNK * max(running, 1)
    # And the service still takes new work on the same workers.
    more = embedding_lines(120)
    b2 = rsdk.batches.create(input_file_id=upload(rsdk, jsonl(more)).id,
                             endpoint="/v1/embeddings", completion_window="24h")
    b2 = wait(rsdk, b2.id, timeout=180)
    assert b2.status == "completed"
    exactly_once(rsdk, b2, more)


def test_redis_restart_mid_batch(rstack, rsdk, rctx, broker, two_workers) -> None:  # type: ignore[no-untyped-def]
    b, rows, running = start_batch(rsdk, rctx, 1600)
    before = heartbeats(broker.url)
    restarted_at = time.time()
    broker.stop()  # SIGTERM: redis-server fsyncs its AOF and exits
    time.sleep(4)  # longer than the DB lease: the janitor cannot reach Redis either
    broker.start()  # same port, same data dir: queued messages come back
    finish(rctx, rsdk, b, rows, running, two_workers)
    # The running shards went on through the outage (leases and checkpoints live in
    # PostgreSQL): no pool process was replaced and no result was computed twice.
    assert heartbeats(broker.url, since=restarted_at) == before
    assert recomputed(rctx, b.id, len(rows)) == 0


def test_postgres_restart_mid_batch(rstack, rsdk, rctx, database, two_workers) -> None:  # type: ignore[no-untyped-def]
    b, rows, running = start_batch(rsdk, rctx, 1600)
    rctx.db.dispose()
    database.stop()
    # Meanwhile the API answers 503 with retry-after, never 500.
    req = urllib.request.Request(f"{rstack.base_url}/v1/batches/{b.id}",
                                 headers={"Authorization": f"Bearer {rstack.api_key}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 503 and e.value.headers["retry-after"]
    time.sleep(4)  # longer than the lease: workers' checkpoints and renewals fail
    database.start()
    finish(rctx, rsdk, b, rows, running, two_workers)
