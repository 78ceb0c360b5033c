"""Everything a client can send wrong gets a 4xx in the OpenAI error shape (real
PostgreSQL, Redis and S3 behind the Flask app; no worker needed)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.tenants import auth
from tests.helpers import emb_line, jsonl


def assert_error(resp: Any, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    return err  # type: ignore[no-any-return]


def upload(client: Any, data: bytes, purpose: str = "batch", name: str = "in.jsonl") -> Any:
    return client.post("/v1/files", data={"file": (io.BytesIO(data), name), "purpose": purpose},
                       content_type="multipart/form-data")


def batch(client: Any, **overrides: Any) -> Any:
    body = {"input_file_id": "file-none", "endpoint": "/v1/embeddings",
            "completion_window": "24h", **overrides}
    return client.post("/v1/batches", json=body)


def test_auth_required(app) -> None:  # type: ignore[no-untyped-def]
    c = app.test_client()
    assert_error(c.get("/v1/batches"), 401)
    c.environ_base["HTTP_AUTHORIZATION"] = "Bearer wrong"
    assert assert_error(c.get("/v1/files"), 401)["code"] == "invalid_api_key"


def test_upload_problems(client) -> None:  # type: ignore[no-untyped-def]
    assert_error(upload(client, b""), 400, "file")
    assert_error(upload(client, b"{}\n", purpose="fine-tune"), 400, "purpose")
    assert_error(client.post("/v1/files", data={"purpose": "batch"},
                             content_type="multipart/form-data"), 400, "file")


def test_batch_create_problems(client, other_tenant_key, app) -> None:  # type: ignore[no-untyped-def]
    assert_error(batch(client), 404, "input_file_id")
    fid = upload(client, jsonl([emb_line(0, "x")])).get_json()["id"]
    assert_error(batch(client, input_file_id=fid, endpoint="/v1/nope"), 400, "endpoint")
    assert_error(batch(client, input_file_id=fid, completion_window="1h"), 400,
                 "completion_window")
    assert_error(batch(client, input_file_id=fid, metadata={f"k{i}": "v" for i in range(17)}),
                 400, "metadata")
    assert_error(batch(client, input_file_id=fid, metadata={"k": "v" * 513}), 400, "metadata")
    assert_error(batch(client, input_file_id=fid, metadata={"k" * 65: "v"}), 400, "metadata")
    assert_error(batch(client, input_file_id=fid, body={"model": "nope"}), 400, "body.model")
    assert_error(client.post("/v1/batches", data="not json", content_type="application/json"),
                 400)
    # another tenant's file is invisible: 404, not 403
    other = app.test_client()
    other.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {other_tenant_key}"
    assert_error(other.post("/v1/batches", json={"input_file_id": fid,
                                                 "endpoint": "/v1/embeddings",
                                                 "completion_window": "24h"}), 404)
    assert_error(other.get(f"/v1/files/{fid}"), 404)
    assert_error(other.get(f"/v1/files/{fid}/content"), 404)


def test_output_file_is_not_a_batch_input(client, ctx) -> None:  # type: ignore[no-untyped-def]
    from jobs.core.schema import File, new_id, now

    tenant = client.get("/v1/files")  # authenticates; find the tenant through a file
    assert tenant.status_code == 200
    fid = upload(client, jsonl([emb_line(0, "x")])).get_json()["id"]
    with ctx.db.session() as s:
        f = s.get(File, fid)
        out = File(id=new_id("file-"), tenant_id=f.tenant_id, filename="o.jsonl",
                   purpose="batch_output", format="jsonl", bytes=f.bytes,
                   object_key=f.object_key, created_at=now())
        s.add(out)
    assert_error(batch(client, input_file_id=out.id), 400, "input_file_id")


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=abc", "after=" + "x" * 80])
def test_bad_pagination(client, query: str) -> None:  # type: ignore[no-untyped-def]
    assert_error(client.get(f"/v1/batches?{query}"), 400)
    assert_error(client.get(f"/v1/files?{query}"), 400)


def test_unknown_objects_and_routes(client) -> None:  # type: ignore[no-untyped-def]
    assert_error(client.get("/v1/batches/batch_nope"), 404)
    assert_error(client.post("/v1/batches/batch_nope/cancel"), 404)
    assert_error(client.get("/v1/files/file-nope/content"), 404)
    assert_error(client.delete("/v1/files/file-nope"), 404)
    assert_error(client.get("/v1/models/nope"), 404)
    assert_error(client.get("/v1/nothing-here"), 404)
    assert_error(client.put("/v1/batches"), 405)


@pytest.mark.parametrize("body,param", [
    ({"model": "nope", "input": "x"}, "model"),
    ({"model": "all-MiniLM-L6-v2"}, "input"),
    ({"model": "all-MiniLM-L6-v2", "input": ""}, "input"),
    ({"model": "all-MiniLM-L6-v2", "input": []}, "input"),
    ({"model": "all-MiniLM-L6-v2", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "all-MiniLM-L6-v2", "input": "x", "dimensions": 0}, "dimensions"),
    ({"model": "all-MiniLM-L6-v2", "input": ["x"] * 3000}, "input"),
])
def test_embeddings_bad_input(client, body: dict[str, Any], param: str) -> None:  # type: ignore[no-untyped-def]
    assert_error(client.post("/v1/embeddings", json=body), 400, param)


def test_models_listed(client) -> None:  # type: ignore[no-untyped-def]
    data = client.get("/v1/models").get_json()["data"]
    assert {"id": "all-MiniLM-L6-v2", "object": "model"}.items() <= data[0].items()


@pytest.fixture
def own_client(own_settings: Settings) -> Iterator[tuple[Any, Context]]:
    """An app and a tenant on a database and Redis DB of their own: the batch this
    test makes must not be validated or run by a stack's workers meanwhile."""
    from api.app import create_app

    ctx = Context(own_settings)
    key = auth.create_tenant(ctx, "cancel")[1]
    c = create_app(own_settings).test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    yield c, ctx
    ctx.close()


def test_cancel_of_finished_batch_is_409(own_client: tuple[Any, Context]) -> None:
    from jobs.core.schema import Batch

    client, ctx = own_client
    fid = upload(client, jsonl([emb_line(0, "x")])).get_json()["id"]
    bid = batch(client, input_file_id=fid).get_json()["id"]
    with ctx.db.session() as s:
        b = s.get(Batch, bid)
        assert b is not None and b.status == "validating"  # nobody took it meanwhile
        b.status = "failed"
    resp = client.post(f"/v1/batches/{bid}/cancel")
    assert_error(resp, 409)
    assert resp.headers["x-should-retry"] == "false"
