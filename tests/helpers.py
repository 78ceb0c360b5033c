"""Helpers the test modules share (no test module imports another): request lines and
files, waiting for a batch, the `inferq` command in a clean environment, clients of an
app served in this process (a "world"), a batch run in this process, and what the
failure matrix checks after a fault."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from jobs.core.schema import Shard
from jobs.core.settings import Settings

CLI = [sys.executable, "-m", "cli.main"]  # the `inferq` command, run as a user runs it


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a user with nothing configured: no INFERQ_* or endpoint that
    the test session set leaks into it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("INFERQ_") and k != "AWS_ENDPOINT_URL"}
    env.update(INFERQ_DATA_DIR=str(data_dir), HF_HUB_OFFLINE="1", **extra)
    return env


@dataclass
class Started:
    """An ``inferq up`` that said it is up: its process, port, stderr file, banner
    lines (keys, token, data dir, metrics heading, metrics URLs) and the metrics URLs
    by name."""

    proc: subprocess.Popen[str]
    port: int
    stderr: Path
    banner: list[str]
    metrics: dict[str, str]


def start_up(env: dict[str, str], data: Path, *args: str, workers: int = 1) -> Started:
    """``inferq up --port N [args]`` run as a user runs it (``workers``: its model
    workers, ``--workers``), read up to the end of its banner. Its ports (the API's and
    the workers' metrics ports after it) are free when picked; one another program took
    meanwhile makes ``up`` refuse to start, and another block is tried."""
    from tests.conftest import free_ports

    stderr = data.parent / f"{data.name}-up.err"
    for _ in range(3):
        port = free_ports(2 + workers)
        with stderr.open("w") as err:
            proc = subprocess.Popen([*CLI, "up", "--port", str(port), "--workers",
                                     str(workers), *args], env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "inferq is up: …" once everything answers
        if first.startswith("inferq is up"):
            break
        proc.wait(120)  # it stops what it started, then says why on stderr
        if "is in use" not in stderr.read_text():
            break
    assert first.startswith("inferq is up"), first + stderr.read_text()
    out = proc.stdout
    assert out is not None
    banner = [out.readline() for _ in range(5)]  # keys, token, data dir, metrics heading
    assert banner[-1].startswith("metrics ("), banner
    urls = [out.readline() for _ in range(int(banner[-1].split("(")[1].split()[0]))]
    metrics = dict(line.strip().rsplit(": ", 1) for line in urls)
    return Started(proc, port, stderr, banner + urls, metrics)


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def emb_line(i: int | str, text: str, model: str = "all-MiniLM-L6-v2",
             url: str = "/v1/embeddings") -> dict[str, Any]:
    return {"custom_id": f"req-{i}", "method": "POST", "url": url,
            "body": {"model": model, "input": text}}


def upload(sdk: Any, data: bytes, name: str = "input.jsonl") -> Any:
    return sdk.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def wait(sdk: Any, batch_id: str, timeout: float = 300,
         until: tuple[str, ...] = ("completed", "failed", "cancelled", "expired")) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = sdk.batches.retrieve(batch_id)
        if b.status in until:
            return b
        time.sleep(0.3)
    raise TimeoutError(f"batch {batch_id} still {b.status} after {timeout}s")


def lines(sdk: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in sdk.files.content(file_id).read().splitlines() if x]


def chat_line(i: int | str, content: str, model: str, max_tokens: int = 8) -> dict[str, Any]:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "temperature": 0, "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": content}]}}


def held_models(embeddings: tuple[tuple[Any, Any], ...] = (),
                chats: dict[str, Any] | None = None) -> Any:
    """A worker's residency holding version 1 of each embedding model given (its model
    and engine) and of each chat model given (``name -> build()`` of its engine); it
    refuses to load anything else."""
    from typing import cast

    from jobs.core.context import Context
    from jobs.core.schema import Model
    from workers.models.residency import Residency, Resident

    def no_loads(m: Model) -> Resident:
        raise AssertionError(f"{m.name} must not be loaded")

    held = Residency(cast(Context, None), loader=no_loads)
    for model, engine in embeddings:
        held.hold(Resident(Model(name=model.model_id, version="1", kind="embeddings",
                                 files=[]), 0, inputs=model, engine=engine), "configured")
    for name, build in (chats or {}).items():
        held.hold(Resident(Model(name=name, version="1", kind="chat", files=[]), 0,
                           chat=build), "configured")
    return held


def served(call: Any, timeout: float = 300) -> Any:
    """``call()``, retried while its model is not in the API's registry snapshot yet
    (400 model_not_found) or is being loaded by the worker it was placed on (503)."""
    import openai

    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except openai.APIStatusError as e:
            waiting = e.status_code == 503 or e.code == "model_not_found"
            if not waiting or time.monotonic() > deadline:
                raise
            time.sleep(1)


def run_in_process(ctx: Any, batch_id: str, minilm: Any, engine: Any) -> None:
    """Validate the batch, run its shards on this process's model, finalize it."""
    from jobs.batches import finalize, service
    from jobs.batches import queries as repo
    from workers.lanes.batch import run_shard
    from workers.process.breaker import Breaker
    from workers.process.runtime import WorkerRuntime

    service.validate_batch(ctx, batch_id)
    rt = WorkerRuntime(ctx.settings, ctx, "test-worker", Breaker(1000, 1.0),
                       held_models(((minilm, engine),)), "cpu")
    with ctx.db.session() as s:
        shards = [sh.id for sh in repo.shards_of(s, batch_id)]
    assert shards
    for sid in shards:
        run_shard(rt, sid, lambda: False)
    finalize.finalize_batch(ctx, batch_id)


def as_key(app: Any, key: str | None) -> Any:
    """A Flask test client of ``app`` that sends ``key`` (none: no Authorization)."""
    c = app.test_client()
    if key is not None:
        c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return c


def submit_batch(c: Any, rows: int = 1) -> str:
    """The id of a new embeddings batch of ``rows`` rows, sent through a test client."""
    fid = c.post("/v1/files", content_type="multipart/form-data", data={
        "file": (io.BytesIO(jsonl([emb_line(i, f"text {i}") for i in range(rows)])),
                 "in.jsonl"), "purpose": "batch"}).get_json()["id"]
    b = c.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/embeddings",
                                    "completion_window": "24h"})
    assert b.status_code == 200, b.get_data(as_text=True)
    return str(b.get_json()["id"])


WORLD_URL = "http://inferq.test"  # an app called in this process (httpx's WSGI transport)


def world_http(world: dict[str, Any], key: str | None = None) -> Any:
    """A bare HTTP client of a world's app (``world["app"]``), sending the world's
    project key unless ``key``."""
    import httpx2

    return httpx2.Client(transport=httpx2.WSGITransport(app=world["app"]), base_url=WORLD_URL,
                         headers={"Authorization": f"Bearer {key or world['key']}"})


def lake_world(settings: Settings, s3_endpoint: str, project: str,
               models: dict[str, tuple[str, int]], shard_rows: int,
               chunk_rows: int) -> dict[str, Any]:
    """The world of the dataset tests: the app in this process on ``settings`` (shards of
    ``shard_rows``, chunks of ``chunk_rows``), ``models`` as registry rows only (name:
    its kind and context length; the test's worker serves them), a bucket of its own on
    the S3 server and a project named ``project``."""
    import secrets

    import boto3

    from api.app import create_app
    from jobs.fleet import catalog, registry
    from jobs.tenants import auth

    app = create_app(settings.model_copy(update={"shard_rows": shard_rows,
                                                 "chunk_rows": chunk_rows}))
    ctx = app.extensions["inferq"]
    files = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]
    for name, (kind, context_length) in models.items():
        registry.register(ctx, name, "1", kind, "test", files, context_length)
    catalog.invalidate(ctx)
    bucket = f"{project}-{secrets.token_hex(4)}"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=bucket)
    tenant_id, key = auth.create_tenant(ctx, project)
    return {"app": app, "ctx": ctx, "key": key, "project": tenant_id, "s3": s3,
            "bucket": bucket}


def world_sdk(world: dict[str, Any], key: str | None = None) -> Any:
    """The SDK in strict response validation on a world's app, with the world's project
    key unless ``key``."""
    from openai import OpenAI

    return OpenAI(base_url=f"{WORLD_URL}/v1", api_key=key or world["key"],
                  http_client=world_http(world, key), _strict_response_validation=True,
                  max_retries=0)


def api_error(e: Any) -> dict[str, Any]:
    """The error of an SDK ``APIStatusError``, checked to be in the OpenAI error shape."""
    body = e.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param",
                                                             "code"}
    err: dict[str, Any] = body["error"]
    return err


# What the failure matrix checks after a batch ran through a fault ---------------------


def shards(ctx: Any, batch_id: str) -> list[Shard]:
    """A batch's shards' rows, in their order."""
    with ctx.db.session() as s:
        return list(s.scalars(select(Shard).where(Shard.batch_id == batch_id)
                              .order_by(Shard.index)))


def exactly_once(sdk: Any, b: Any, rows: list[dict[str, Any]]) -> None:
    """Every row's custom_id stands once across the batch's output and error files."""
    out = lines(sdk, b.output_file_id) + lines(sdk, b.error_file_id)
    ids = Counter(x["custom_id"] for x in out)
    assert set(ids) == {r["custom_id"] for r in rows}, "lost results"
    assert set(ids.values()) == {1}, "duplicated results"


def computed(ctx: Any, batch_id: str) -> int:
    """Rows whose results workers produced for the batch, by every attempt."""
    return sum(s.rows_computed for s in shards(ctx, batch_id))


def recomputed(ctx: Any, batch_id: str, total: int) -> int:
    """Rows computed more than once: what the faults cost."""
    return computed(ctx, batch_id) - total


def embedding_lines(n: int) -> list[dict[str, Any]]:
    """``n`` embedding requests of one to five sentences."""
    return [emb_line(i, f"sentence number {i} about cats and markets " * (1 + i % 5))
            for i in range(n)]
