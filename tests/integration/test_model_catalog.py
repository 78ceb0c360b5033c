"""The registry is the catalog: a model registered in it is listed by /v1/models and
accepted by every validation path (synchronous calls, /v1/jobs, batch create); an
unknown one is refused with the list of models that serve the endpoint. Real
PostgreSQL, Redis and S3 behind the Flask app; no worker needed."""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import delete

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet import catalog, registry
from tests.helpers import emb_line, jsonl

SUFFIX = secrets.token_hex(3)
EMBEDDER = f"catalog-embedder-{SUFFIX}"
TALKER = f"catalog-talker-{SUFFIX}"
FAKE_FILES = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]


@pytest.fixture(scope="module", autouse=True)
def registered(ctx: Context) -> Iterator[None]:
    # Registered in this process: the API's cached snapshot is dropped at once.
    registry.register(ctx, EMBEDDER, "1", "embeddings", "test", FAKE_FILES, 128)
    registry.register(ctx, TALKER, "3", "chat", "test", FAKE_FILES, 2048)
    yield
    with ctx.db.session() as s:
        s.execute(delete(Model).where(Model.name.endswith(SUFFIX)))
    catalog.invalidate(ctx)


def error_of(resp: Any, status: int = 400) -> dict[str, Any]:
    assert resp.status_code == status, resp.get_data(as_text=True)
    err: dict[str, Any] = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_registered_models_are_listed(client: Any) -> None:
    by_id = {m["id"]: m for m in client.get("/v1/models").get_json()["data"]}
    assert (by_id[EMBEDDER]["kind"], by_id[EMBEDDER]["context_length"]) == ("embeddings", 128)
    assert (by_id[TALKER]["kind"], by_id[TALKER]["version"]) == ("chat", "3")


def test_registered_models_are_accepted_by_jobs(client: Any) -> None:
    for endpoint, body in (("/v1/embeddings", {"model": EMBEDDER, "input": "hi"}),
                           ("/v1/chat/completions",
                            {"model": TALKER, "messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"model": TALKER, "prompt": "hi"})):
        r = client.post("/v1/jobs", json={"endpoint": endpoint, "body": body})
        assert r.status_code == 200, r.get_data(as_text=True)
        assert r.get_json()["status"] == "queued"


def test_unknown_model_lists_the_available_ones(client: Any) -> None:
    err = error_of(client.post("/v1/embeddings", json={"model": "gpt-x", "input": "hi"}))
    assert (err["param"], err["code"]) == ("model", "model_not_found")
    assert err["message"].startswith("The model 'gpt-x' does not exist. Models for "
                                     "/v1/embeddings: ")
    assert EMBEDDER in err["message"] and TALKER not in err["message"]
    err = error_of(client.post("/v1/chat/completions", json={
        "model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}]}))
    assert f"'{EMBEDDER}' is an embeddings model" in err["message"]
    assert TALKER in err["message"]
    err = error_of(client.post("/v1/jobs", json={"endpoint": "/v1/completions",
                                                 "body": {"model": "nope", "prompt": "x"}}))
    assert err["code"] == "model_not_found" and TALKER in err["message"]


def test_batch_body_model_default_comes_from_the_registry(client: Any) -> None:
    up = client.post("/v1/files", data={"file": (io.BytesIO(jsonl([emb_line(0, "x")])),
                                                 "in.jsonl"), "purpose": "batch"},
                     content_type="multipart/form-data")
    fid = up.get_json()["id"]
    base = {"input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    err = error_of(client.post("/v1/batches", json={**base, "body": {"model": "nope"}}))
    assert (err["param"], err["code"]) == ("body.model", "model_not_found")
    assert EMBEDDER in err["message"]
    err = error_of(client.post("/v1/batches", json={**base, "body": {"model": TALKER}}))
    assert "chat model" in err["message"]
    ok = client.post("/v1/batches", json={**base, "body": {"model": EMBEDDER}})
    assert ok.status_code == 200, ok.get_data(as_text=True)


def test_a_model_registered_by_another_process_is_seen_within_the_ttl(ctx: Context) -> None:
    name = f"late-{SUFFIX}"
    before = catalog.cached(ctx)
    with ctx.db.session() as s:  # as another process would: no invalidation here
        s.add(Model(name=name, version="1", kind="embeddings", source="test",
                    object_prefix=f"models/{name}/1/", files=FAKE_FILES, context_length=64,
                    is_default=True, owned_by="test", created_at=0))
    assert catalog.cached(ctx) is before and name not in before.names()
    assert name in catalog.cached(ctx, ttl_s=0).names()
    assert catalog.load(ctx).require(name, "/v1/embeddings").kind == "embeddings"


def test_a_model_registered_by_this_process_is_seen_at_once(ctx: Context) -> None:
    name = f"now-{SUFFIX}"
    before = catalog.cached(ctx, ttl_s=3600)
    assert catalog.cached(ctx, ttl_s=3600) is before
    registry.register(ctx, name, "1", "chat", "test", FAKE_FILES, 64)
    assert catalog.cached(ctx, ttl_s=3600).require(name, "/v1/completions").name == name


def test_a_parquet_batch_without_a_model_is_refused_when_created(client: Any) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"custom_id": ["a"], "input": ["x"]}), buf)
    up = client.post("/v1/files", data={"file": (io.BytesIO(buf.getvalue()), "d.parquet"),
                                        "purpose": "batch"},
                     content_type="multipart/form-data")
    base = {"input_file_id": up.get_json()["id"], "endpoint": "/v1/embeddings",
            "completion_window": "24h"}
    err = error_of(client.post("/v1/batches", json=base))
    assert (err["param"], err["code"]) == ("body.model", "missing_model")
    assert "body.model" in err["message"] and "--model" in err["message"]
    ok = client.post("/v1/batches", json={**base, "body": {"model": EMBEDDER}})
    assert ok.status_code == 200, ok.get_data(as_text=True)
