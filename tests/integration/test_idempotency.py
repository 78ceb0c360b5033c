"""Idempotency-Key on creating POSTs: same key + same body → the same object (also for
concurrent duplicates); same key + another body → 409 that must not be retried; a
refused request leaves its key unused."""

from __future__ import annotations

import io
import secrets
import threading
from typing import Any

from sqlalchemy import func, select

from jobs.core.schema import Batch, File
from tests.helpers import emb_line, jsonl


def post_file(client: Any, data: bytes, key: str) -> Any:
    return client.post("/v1/files", data={"file": (io.BytesIO(data), "in.jsonl"),
                                          "purpose": "batch"},
                       content_type="multipart/form-data", headers={"Idempotency-Key": key})


def test_files_same_key_same_body_same_object(client) -> None:  # type: ignore[no-untyped-def]
    key = secrets.token_hex(8)
    data = jsonl([emb_line(0, "x")])
    a, b = post_file(client, data, key), post_file(client, data, key)
    assert a.status_code == b.status_code == 200
    assert a.get_json()["id"] == b.get_json()["id"]
    assert b.headers["Idempotent-Replayed"] == "true"
    c = post_file(client, jsonl([emb_line(0, "y")]), key)
    assert c.status_code == 409 and c.headers["x-should-retry"] == "false"
    assert c.get_json()["error"]["code"] == "idempotency_key_reused"


def test_batches_concurrent_duplicates_create_one(client, app, tenant_key, ctx) -> None:  # type: ignore[no-untyped-def]
    fid = post_file(client, jsonl([emb_line(0, "x")]), secrets.token_hex(8)).get_json()["id"]
    key = secrets.token_hex(8)
    body = {"input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h",
            "metadata": {"k": key}}
    ids: list[str] = []

    def one() -> None:
        c = app.test_client()
        r = c.post("/v1/batches", json=body, headers={"Idempotency-Key": key,
                                                      "Authorization": f"Bearer {tenant_key}"})
        assert r.status_code == 200, r.get_data()
        ids.append(r.get_json()["id"])

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(ids) == 8 and len(set(ids)) == 1
    with ctx.db.session() as s:
        n = s.scalar(select(func.count()).select_from(Batch)
                     .where(Batch.metadata_["k"].astext == key))
    assert n == 1
    other = client.post("/v1/batches", json={**body, "metadata": {"k": "other"}},
                        headers={"Idempotency-Key": key})
    assert other.status_code == 409 and other.headers["x-should-retry"] == "false"


def test_a_refusal_leaves_its_key_unused_and_keys_are_per_tenant(
        client: Any, app: Any, other_tenant_key: str, ctx: Any) -> None:
    """A refusal created nothing and its cause may be fixed (the file uploaded, the
    model registered): the same request with the same key is run again, not answered
    with the refusal, and the key still creates the object once it can be."""
    key = secrets.token_hex(8)
    bad = {"input_file_id": "file-none", "endpoint": "/v1/embeddings",
           "completion_window": "24h"}
    a = client.post("/v1/batches", json=bad, headers={"Idempotency-Key": key})
    b = client.post("/v1/batches", json=bad, headers={"Idempotency-Key": key})
    assert a.status_code == b.status_code == 404 and a.get_json() == b.get_json()
    assert "Idempotent-Replayed" not in b.headers
    fid = post_file(client, jsonl([emb_line(0, "x")]), secrets.token_hex(8)).get_json()["id"]
    good = {**bad, "input_file_id": fid}
    made = client.post("/v1/batches", json=good, headers={"Idempotency-Key": key})
    again = client.post("/v1/batches", json=good, headers={"Idempotency-Key": key})
    assert made.status_code == again.status_code == 200, made.get_json()
    assert made.get_json()["id"] == again.get_json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = app.test_client()
    other.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {other_tenant_key}"
    data = jsonl([emb_line(0, "per-tenant")])
    mine = post_file(client, data, key + "f").get_json()["id"]
    theirs = post_file(other, data, key + "f").get_json()["id"]
    assert mine != theirs
    with ctx.db.session() as s:
        assert s.scalar(select(func.count()).select_from(File)
                        .where(File.id.in_([mine, theirs]))) == 2
    long_key = client.post("/v1/batches", json=bad, headers={"Idempotency-Key": "k" * 300})
    assert long_key.status_code == 400
