"""A request that names one version of a model, ``name@version`` (``fstack``: API,
control worker, a database of its own; one model worker on the simulated accelerator
holding both versions): the name's traffic goes 100/0 to its default version, and a
realtime request or job naming ``name@2`` is answered by version 2 (the header, the
job's ``model_version`` and the worker's own per-version counter say so), and so is a
batch whose lines name it; an unknown version is refused naming it; /v1/models
lists each version's ``id``.

The model is a test-own name for the packaged all-MiniLM-L6-v2's files (the simulated
accelerator reads their tokenizer, never their weights)."""

from __future__ import annotations

import json
import os
import secrets
import signal
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from sqlalchemy import delete

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet import catalog, registry
from jobs.fleet.heartbeats import live_workers
from tests.helpers import emb_line, jsonl, upload, wait
from tests.polling import until

pytestmark = pytest.mark.slow

SFX = secrets.token_hex(3)
NAME = f"named-{SFX}"
V2 = f"{NAME}@2"
SIM = {"INFERQ_ACCELERATOR": "simulated", "INFERQ_SIMULATED_PROFILE": "h100-minilm",
       "INFERQ_WORKER_HEARTBEAT_S": "1"}


@pytest.fixture(scope="module")
def ctx_of(fstack: Any) -> Iterator[Context]:
    """NAME in versions 1 (the default, all of the traffic) and 2 (weight 0)."""
    ctx = Context(fstack.settings)
    base = registry.get_default(ctx, "all-MiniLM-L6-v2")
    assert base is not None
    for version, default in (("1", "this"), ("2", "keep")):
        registry.register(ctx, NAME, version, "embeddings", "test: all-MiniLM-L6-v2's files",
                          base.files, base.context_length, object_prefix=base.object_prefix,
                          default=default)
    registry.set_rollout(ctx, NAME, "2", weight=0.0)
    yield ctx
    with ctx.db.session() as s:
        s.execute(delete(Model).where(Model.name == NAME))
    catalog.invalidate(ctx)
    ctx.close()


@pytest.fixture(scope="module")
def worker(fstack: Any, ctx_of: Context) -> Iterator[str]:
    """One worker holding both versions: its heartbeat's name."""
    proc = fstack.start_model_worker(f"named-{SFX}", "realtime,jobs,batch", **SIM,
                                     INFERQ_EMBEDDING_MODEL=NAME, INFERQ_MODELS=V2)
    beats = until(lambda: [b for b in live_workers(ctx_of.redis, "realtime")
                           if {f"{NAME}@1", V2} <= set(b["resident"])],
                  timeout=180, what="a worker holding both versions")
    yield beats[0]["name"]
    if fstack.procs.pop(f"worker-named-{SFX}", None) is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def served(ctx: Context, worker: str) -> dict[str, int]:
    """The worker's own count of the requests each version answered."""
    beat = [b for b in live_workers(ctx.redis, "realtime") if b["name"] == worker]
    assert beat, f"{worker} has no heartbeat"
    return {m["ref"]: m["served"] for m in beat[0]["residency"]["models"]}


def embed(fsdk: Any, model: str, text: str) -> str:
    """One realtime request through the SDK; the version that answered (its header)."""
    raw = fsdk.embeddings.with_raw_response.create(model=model, input=text,
                                                   encoding_format="float")
    assert raw.parse().model == NAME  # the answer names the model; the header its version
    return str(raw.headers["inferq-model-version"])


def test_a_named_version_answers_realtime_requests_and_jobs(
        fsdk: Any, ctx_of: Context, worker: str) -> None:
    until(lambda: served(ctx_of, worker), what="the worker's residency report")
    before = served(ctx_of, worker)
    assert [embed(fsdk, NAME, f"plain {i}") for i in range(10)] == ["1"] * 10  # 100/0
    assert [embed(fsdk, V2, f"named {i}") for i in range(10)] == ["2"] * 10
    job = fsdk.post("/jobs", cast_to=object, body={
        "endpoint": "/v1/embeddings", "body": {"model": V2, "input": "a job"}})
    assert job["model_version"] == "2"
    done = until(lambda: fsdk.get(f"/jobs/{job['id']}", cast_to=object),
                 lambda j: j["status"] in ("completed", "failed"), timeout=60)
    assert done["status"] == "completed", done
    assert done["result"]["model"] == NAME and len(done["result"]["data"]) == 1
    # 10 + 1 on version 2 (the requests, then the job), 10 on version 1.
    until(lambda: served(ctx_of, worker),
          lambda now: (now.get(V2, 0) - before.get(V2, 0),
                       now.get(f"{NAME}@1", 0) - before.get(f"{NAME}@1", 0)) == (11, 10),
          timeout=30, what="the worker's counts per version")


def test_an_unknown_version_is_refused_naming_it(fsdk: Any, ctx_of: Context) -> None:
    for call in (lambda: fsdk.embeddings.create(model=f"{NAME}@9", input="hi"),
                 lambda: fsdk.post("/jobs", cast_to=object, body={
                     "endpoint": "/v1/embeddings",
                     "body": {"model": f"{NAME}@9", "input": "hi"}})):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.code == "model_not_found"
        assert e.value.param in ("model", "body.model")
        assert f"'{NAME}' has no version '9'. Its versions: 1, 2" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # the name is unknown: as before
        fsdk.embeddings.create(model=f"no-such-{SFX}@1", input="hi")
    assert e.value.code == "model_not_found" and "does not exist" in e.value.message


def test_a_batch_runs_on_the_version_its_lines_name(
        fsdk: Any, ctx_of: Context, worker: str) -> None:
    until(lambda: served(ctx_of, worker), what="the worker's residency report")
    before = served(ctx_of, worker)
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(
        [emb_line(i, f"row {i}", model=V2) for i in range(3)])).id,
        endpoint="/v1/embeddings", completion_window="24h")
    done = wait(fsdk, b.id, timeout=120)
    assert done.status == "completed" and done.request_counts.completed == 3, done
    got = fsdk.get(f"/batches/{b.id}", cast_to=object)
    assert (got["model"], got["model_version"]) == (NAME, "2"), got
    lines = [json.loads(x) for x in fsdk.files.content(done.output_file_id).text.splitlines()]
    assert {x["response"]["body"]["model"] for x in lines} == {NAME}
    until(lambda: served(ctx_of, worker),
          lambda now: now.get(V2, 0) - before.get(V2, 0) == 3,
          timeout=30, what="version 2 counting the batch's rows")
    # one batch, one version: the bare name beside name@version fails its validation
    mixed = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(
        [emb_line(0, "a", model=V2), emb_line(1, "b", model=NAME)])).id,
        endpoint="/v1/embeddings", completion_window="24h")
    failed = wait(fsdk, mixed.id, timeout=60)
    assert failed.status == "failed", failed
    assert failed.errors.data[0].code == "mismatched_model", failed.errors


def test_models_lists_each_version_by_the_id_a_request_names(fsdk: Any,
                                                             ctx_of: Context) -> None:
    m = fsdk.get(f"/models/{NAME}", cast_to=object)
    assert [(v["id"], v["version"], v["traffic_weight"]) for v in m["versions"]] == [
        (f"{NAME}@1", "1", 1.0), (V2, "2", 0.0)]
