"""A registered model that no worker serves is refused, never answered by another model:
503 + retry-after on the synchronous calls (the API sees no live worker announcing
it), and the request's own 503 ``model_not_loaded`` error in a job or a batch line
(the worker refuses what it does not hold). Token ids outside the model's vocabulary
are a 400, not a failed micro-batch."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from sqlalchemy import delete

from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet import catalog, heartbeats, registry
from tests.helpers import emb_line, jsonl, lines, upload, wait

pytestmark = pytest.mark.slow

SUFFIX = secrets.token_hex(3)
EMBEDDER = f"unserved-embedder-{SUFFIX}"
TALKER = f"unserved-talker-{SUFFIX}"
FAKE_FILES = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]


@pytest.fixture(scope="module", autouse=True)
def registered(ctx: Context) -> Iterator[None]:
    """Registered (so validation accepts them) but served by no worker of the stack."""
    registry.register(ctx, EMBEDDER, "1", "embeddings", "test", FAKE_FILES, 128)
    registry.register(ctx, TALKER, "1", "chat", "test", FAKE_FILES, 2048)
    yield
    with ctx.db.session() as s:
        s.execute(delete(Model).where(Model.name.endswith(SUFFIX)))
    catalog.invalidate(ctx)


def once_registered(call: Callable[[], Any]) -> Any:
    """``call()``, retried while the API's registry snapshot (a few seconds old at most)
    does not know the model yet."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return call()
        except openai.BadRequestError as e:
            if e.code != "model_not_found" or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_sync_calls_for_a_model_no_worker_serves_are_503(sdk) -> None:  # type: ignore[no-untyped-def]
    for call in (lambda: sdk.embeddings.create(model=EMBEDDER, input="hi"),
                 lambda: sdk.chat.completions.create(
                     model=TALKER, messages=[{"role": "user", "content": "hi"}])):
        t0 = time.monotonic()
        with pytest.raises(openai.InternalServerError) as e:
            once_registered(call)
        assert time.monotonic() - t0 < 20  # refused, not timed out
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"]
        assert e.value.code == "model_not_loaded"
        assert "no worker serves model " in e.value.message
    ok = sdk.embeddings.create(model="all-MiniLM-L6-v2", input="hi", encoding_format="float")
    assert ok.model == "all-MiniLM-L6-v2"


def where_waiting(ctx: Context, job_id: str) -> dict[str, Any]:
    """The lists a job id waits on, and the live jobs workers (for a failure message)."""
    lists = [redis_keys.JOBS_QUEUE, *(k.decode() for k in ctx.redis.scan_iter(
        match=redis_keys.JOBS_QUEUE + ":*"))]
    return {"on": [q for q in lists if ctx.redis.lpos(q, job_id) is not None],
            "jobs workers": [b["name"] for b in heartbeats.live_workers(ctx.redis, "jobs")]}


def test_a_job_for_a_model_no_worker_serves_fails_with_the_reason(sdk, ctx) -> None:  # type: ignore[no-untyped-def]
    # Pushed while the jobs workers' heartbeats are missing, as on a loaded machine where
    # they come late: the job waits on its version's list until a sweep finds a jobs
    # worker live again, places the version there, and its load fails (docs/RELIABILITY.md).
    beating = [b["name"] for b in heartbeats.live_workers(ctx.redis, "jobs")]
    assert beating
    for name in beating:
        ctx.redis.delete(redis_keys.WORKERS + name)
    try:
        job: dict[str, Any] = once_registered(lambda: sdk.post(
            "/jobs", cast_to=object,
            body={"endpoint": "/v1/embeddings", "body": {"model": EMBEDDER, "input": "hi"}}))
        deadline = time.monotonic() + 120
        while job["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, (job, where_waiting(ctx, job["id"]))
            time.sleep(0.2)
            job = sdk.get(f"/jobs/{job['id']}", cast_to=object)
    finally:  # the next tests find the stack's workers announced again
        deadline = time.monotonic() + 60
        while not all(ctx.redis.exists(redis_keys.WORKERS + n) for n in beating):
            assert time.monotonic() < deadline, "the stack's workers did not beat again"
            time.sleep(0.2)
    assert job["status"] == "failed" and job["result"] is None
    assert job["error"]["code"] == "model_not_loaded"
    assert f"no worker serves model '{EMBEDDER}'" in job["error"]["message"]


def test_batch_lines_for_a_model_no_worker_serves_are_503_lines(sdk) -> None:  # type: ignore[no-untyped-def]
    data = jsonl([emb_line(i, f"text {i}", model=EMBEDDER) for i in range(3)])
    b = once_registered(lambda: sdk.batches.create(
        input_file_id=upload(sdk, data).id, endpoint="/v1/embeddings",
        completion_window="24h"))
    b = wait(sdk, b.id, timeout=180)
    assert b.status == "completed", b
    assert (b.request_counts.completed, b.request_counts.failed) == (0, 3)
    assert lines(sdk, b.output_file_id) == []
    errs = lines(sdk, b.error_file_id)
    assert sorted(o["custom_id"] for o in errs) == ["req-0", "req-1", "req-2"]
    for o in errs:
        assert o["response"]["status_code"] == 503
        assert o["response"]["body"]["error"]["code"] == "model_not_loaded"


def test_token_ids_outside_the_vocabulary_are_400(sdk) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as e:
        sdk.embeddings.create(model="all-MiniLM-L6-v2", input=[99999])
    assert e.value.code == "invalid_token_id" and e.value.param == "input"
    assert "30522" in e.value.message
