"""Past one machine: three "hosts" on this one, each with a data dir and a model cache of
its own, around one PostgreSQL database, one Redis database and the S3 server (moto,
over HTTP; never the local-directory store).

- host a: an API, the control worker and a model worker (embeddings);
- host b: a second API and a model worker that also serves the chat model;
- host c: a model worker on the batch lane only.

A batch submitted through API a spreads over the workers of every host (the shards'
``worker`` column and the workers' own ``inferq_batch_rows`` counters say so); API a
is SIGKILLed while the batch runs and a job it accepted waits; API b then serves the
batch's results, the job's result and a chat stream: nothing is lost, every custom_id
appears exactly once.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import openai
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.schema import Shard
from jobs.core.settings import Settings
from jobs.fleet.heartbeats import live_workers
from tests.conftest import AWS_ENV, RedisDatabases, free_port, fresh_database
from tests.helpers import emb_line, jsonl, lines, upload, wait

pytestmark = pytest.mark.slow

MINILM, SMOL = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
ROWS = 480


@pytest.fixture(scope="module")
def fleet(settings: Settings, pg_admin_url: str, redis_dbs: RedisDatabases, s3_endpoint: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from cli.stack import Stack

    with fresh_database(pg_admin_url) as db, redis_dbs.lend() as rurl:
        shared = settings.model_copy(update={
            "database_url": db, "redis_url": rurl,
            "object_store_url": f"s3://inferq-test/fleet-{secrets.token_hex(4)}",
            "shard_rows": 40, "chunk_rows": 20, "torch_threads": 1,
            "worker_heartbeat_s": 1})
        env = {**AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint, "INFERQ_CHAT_MODEL": ""}

        def host(name: str) -> Stack:
            data: Path = tmp_path_factory.mktemp(f"host-{name}")
            return Stack(shared.model_copy(update={"data_dir": data}), port=free_port(),
                         extra_env=env, log_dir=data / "logs", model_workers=0)

        a, b, c = host("a"), host("b"), host("c")
        try:
            a.start(api=True, workers=True)  # the API and the control worker
            a.start_model_worker("a1", "realtime,jobs,batch")
            b.start(api=True, workers=False)
            b.start_model_worker("b1", "realtime,jobs,batch", INFERQ_CHAT_MODEL=SMOL)
            c.start(api=False, workers=False)
            c.start_model_worker("c1", "batch")
            r = redis.Redis.from_url(rurl)
            deadline = time.monotonic() + 300
            while len(live_workers(r, "batch")) < 3:
                assert time.monotonic() < deadline, "the fleet's workers did not come up"
                for s in (a, b, c):
                    for n, p in s.procs.items():
                        assert p.poll() is None, f"{n} exited: see {s.log_path(n)}"
                time.sleep(0.5)
            yield {"a": a, "b": b, "c": c, "redis": r, "settings": shared}
            r.close()
        finally:
            for s in (c, b, a):
                s.stop()


def sdk_for(stack: Any) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key,
                  _strict_response_validation=True, max_retries=0, timeout=120)


def worker_rows(r: redis.Redis) -> dict[str, float]:
    """Batch rows each live worker computed, by its own metrics endpoint."""
    out = {}
    for h in live_workers(r, "batch"):
        if not h.get("metrics_url"):
            continue
        with urlopen(h["metrics_url"], timeout=10) as resp:
            text = resp.read().decode()
        out[h["name"]] = sum(s.value for f in text_string_to_metric_families(text)
                             if f.name == "inferq_batch_rows" for s in f.samples
                             if s.name.endswith("_total"))
    return out


def test_a_batch_spreads_over_hosts_and_an_api_dying_loses_nothing(fleet: dict[str, Any]
                                                                   ) -> None:
    a, b, r = fleet["a"], fleet["b"], fleet["redis"]
    sa, sb = sdk_for(a), sdk_for(b)
    # Both hosts' keys belong to the same project ("default"): what a accepted, b serves.
    rows = [emb_line(i, f"row {i} of a batch spread over three hosts") for i in range(ROWS)]
    f = upload(sa, jsonl(rows))
    batch = sa.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    job = sa.post("/jobs", cast_to=object, body={"endpoint": "/v1/embeddings", "body": {
        "model": MINILM, "input": "accepted by the API that is about to die"}})
    assert isinstance(job, dict) and job["object"] == "job"

    deadline = time.monotonic() + 120
    while sb.batches.retrieve(batch.id).request_counts.completed == 0:
        assert time.monotonic() < deadline, "the batch did not start"
        time.sleep(0.2)
    os.killpg(a.procs["api"].pid, signal.SIGKILL)  # API a dies mid-batch
    a.procs["api"].wait()
    with pytest.raises(openai.APIConnectionError):  # a is gone
        sa.models.list()

    stream = sb.chat.completions.create(model=SMOL, stream=True, max_tokens=8,
                                        temperature=0,
                                        messages=[{"role": "user", "content": "Say hi"}])
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces).strip(), "the stream through API b carried no text"

    done = wait(sb, batch.id, timeout=300)
    assert done.status == "completed", done
    out = lines(sb, done.output_file_id)
    ids = [x["custom_id"] for x in out]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(ROWS))  # each exactly once
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert lines(sb, done.error_file_id) == []

    deadline = time.monotonic() + 60
    while (got := sb.get(f"/jobs/{job['id']}", cast_to=object))["status"] != "completed":
        assert isinstance(got, dict) and got["status"] not in ("failed", "cancelled"), got
        assert time.monotonic() < deadline, got
        time.sleep(0.3)

    ctx = Context(fleet["settings"])
    try:
        with ctx.db.session() as s:
            by_worker = list(s.scalars(select(Shard.worker).where(Shard.batch_id == batch.id)))
    finally:
        ctx.close()
    ran = {w for w in by_worker if w}  # host:pid of the worker that finished each shard
    assert len(ran) >= 2, f"every shard ran on one worker: {ran}"
    counted = worker_rows(r)
    assert sum(counted.values()) == ROWS, counted  # computed once: no row twice
    assert sum(1 for v in counted.values() if v > 0) >= 2, counted
    print("\nshards per worker:", json.dumps({w: by_worker.count(w) for w in set(by_worker)}))
