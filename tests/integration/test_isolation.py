"""The isolation matrix: every route that takes an object id, called by project B with
project A's ids, answers 404 in the OpenAI error shape and changes nothing of A's; no
listing of B shows A's objects. The routes come from the app's url_map, so a new route
with an id fails ``test_the_matrix_covers_every_route_with_an_id`` until it is covered
here (real PostgreSQL, Redis and S3 behind the Flask app; no worker needed)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.upload_tables import Upload, UploadPart
from jobs.tenants import auth
from jobs.tenants import projects as tenants
from jobs.webhooks import events as webhooks
from tests.helpers import emb_line, jsonl

ORG = "/v1/organization/projects"
# (method, rule) -> path with A's ids ({file_id}, ...) and B's own ({b_project_id}), sent
# with B's key (a project route) or the admin key under B's project (an admin route).
COVERED = {
    ("GET", "/v1/files/<file_id>"): "/v1/files/{file_id}",
    ("GET", "/v1/files/<file_id>/content"): "/v1/files/{file_id}/content",
    ("DELETE", "/v1/files/<file_id>"): "/v1/files/{file_id}",
    ("GET", "/v1/batches/<batch_id>"): "/v1/batches/{batch_id}",
    ("POST", "/v1/batches/<batch_id>/cancel"): "/v1/batches/{batch_id}/cancel",
    ("GET", "/v1/batches/<batch_id>/events"): "/v1/batches/{batch_id}/events",
    ("GET", "/v1/batches/<batch_id>/output"): "/v1/batches/{batch_id}/output?partial=true",
    ("POST", "/v1/batches/<batch_id>/retry"): "/v1/batches/{batch_id}/retry",
    ("GET", "/v1/batches/<batch_id>/merged_output"): "/v1/batches/{batch_id}/merged_output",
    ("GET", "/v1/jobs/<job_id>"): "/v1/jobs/{job_id}",
    ("POST", "/v1/uploads/<upload_id>/parts"): "/v1/uploads/{upload_id}/parts",
    ("POST", "/v1/uploads/<upload_id>/complete"): "/v1/uploads/{upload_id}/complete",
    ("POST", "/v1/uploads/<upload_id>/cancel"): "/v1/uploads/{upload_id}/cancel",
    ("GET", "/v1/dashboard/batches/<batch_id>"): "/v1/dashboard/batches/{batch_id}",
    ("GET", "/v1/webhook_endpoints/<webhook_endpoint_id>"):
        "/v1/webhook_endpoints/{webhook_endpoint_id}",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>"):
        "/v1/webhook_endpoints/{webhook_endpoint_id}",
    ("DELETE", "/v1/webhook_endpoints/<webhook_endpoint_id>"):
        "/v1/webhook_endpoints/{webhook_endpoint_id}",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>/rotate_secret"):
        "/v1/webhook_endpoints/{webhook_endpoint_id}/rotate_secret",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>/test"):
        "/v1/webhook_endpoints/{webhook_endpoint_id}/test",
    ("GET", "/v1/webhook_endpoints/<webhook_endpoint_id>/deliveries"):
        "/v1/webhook_endpoints/{webhook_endpoint_id}/deliveries",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>/deliveries/<delivery_id>/resend"):
        "/v1/webhook_endpoints/{webhook_endpoint_id}/deliveries/{delivery_id}/resend",
    ("GET", f"{ORG}/<project_id>/service_accounts/<service_account_id>"):
        f"{ORG}/{{b_project_id}}/service_accounts/{{service_account_id}}",
    ("DELETE", f"{ORG}/<project_id>/service_accounts/<service_account_id>"):
        f"{ORG}/{{b_project_id}}/service_accounts/{{service_account_id}}",
    ("POST", f"{ORG}/<project_id>/service_accounts/<service_account_id>/api_keys"):
        f"{ORG}/{{b_project_id}}/service_accounts/{{service_account_id}}/api_keys",
    ("GET", f"{ORG}/<project_id>/api_keys/<api_key_id>"):
        f"{ORG}/{{b_project_id}}/api_keys/{{api_key_id}}",
    ("DELETE", f"{ORG}/<project_id>/api_keys/<api_key_id>"):
        f"{ORG}/{{b_project_id}}/api_keys/{{api_key_id}}",
}
# Routes with an id that belongs to no project, and why.
NOT_PROJECT_OBJECTS = {
    ("GET", "/v1/models/<path:model_id>"): "models are the service's, served to every project",
    ("GET", "/v1/organization/models/<name>/rollout"): "models are the service's",
    ("POST", "/v1/organization/models/<name>/rollout"): "models are the service's",
    ("POST", "/v1/organization/models/<name>/versions/<version>/pool"):
        "models are the service's",
    ("DELETE", "/v1/organization/models/<name>/versions/<version>"): "models are the service's",
    ("GET", "/dashboard/static/<path:asset>"): "the dashboard's own files, the same for all",
    # The admin key administers every project: a project id is its own scope.
    ("GET", f"{ORG}/<project_id>"): "the project itself",
    ("POST", f"{ORG}/<project_id>"): "the project itself",
    ("POST", f"{ORG}/<project_id>/archive"): "the project itself",
    ("POST", f"{ORG}/<project_id>/service_accounts"): "the project itself",
    ("GET", f"{ORG}/<project_id>/service_accounts"): "the project itself",
    ("GET", f"{ORG}/<project_id>/api_keys"): "the project itself",
    ("GET", f"{ORG}/<project_id>/rate_limits"): "the project itself",
    ("POST", f"{ORG}/<project_id>/data_locations"): "the project itself",
    ("GET", f"{ORG}/<project_id>/data_locations"): "the project itself",
    # a location id is looked up within the project of the path (locations.remove)
    ("DELETE", f"{ORG}/<project_id>/data_locations/<location_id>"): "the project itself",
    # rl-<model> names a model; its values are the project's (test_limits_are_per_project)
    ("POST", f"{ORG}/<project_id>/rate_limits/<rate_limit_id>"): "a model, per project",
}


def with_ids(app: Any) -> set[tuple[str, str]]:
    return {(m, rule.rule) for rule in app.url_map.iter_rules()
            if rule.arguments and rule.endpoint != "static"
            for m in (rule.methods or set()) - {"HEAD", "OPTIONS"}}


def test_the_matrix_covers_every_route_with_an_id(app: Any) -> None:
    assert with_ids(app) == set(COVERED) | set(NOT_PROJECT_OBJECTS)
    assert not set(COVERED) & set(NOT_PROJECT_OBJECTS)


def as_key(app: Any, key: str) -> Any:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return c


@pytest.fixture(scope="module")
def a_objects(app: Any, ctx: Context, tenant_key: str, other_tenant_key: str
              ) -> dict[str, str]:
    """Project A's objects of every kind (A: ``tenant_key``, B: ``other_tenant_key``)."""
    a = as_key(app, tenant_key)
    fid = a.post("/v1/files", content_type="multipart/form-data", data={
        "file": (io.BytesIO(jsonl([emb_line(0, "x")])), "in.jsonl"), "purpose": "batch",
    }).get_json()["id"]
    batch = a.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/embeddings",
                                        "completion_window": "24h"})
    assert batch.status_code == 200, batch.get_data(as_text=True)
    job = a.post("/v1/jobs", json={"endpoint": "/v1/embeddings",
                                   "body": {"model": "all-MiniLM-L6-v2", "input": "x"}})
    assert job.status_code == 200, job.get_data(as_text=True)
    a_project = auth.authenticate(ctx, tenant_key).tenant_id
    sa, key = tenants.create_service_account(ctx, a_project, "a-etl")
    assert key is not None
    hook = a.post("/v1/webhook_endpoints", json={  # a public address: no DNS needed
        "name": "a", "url": "https://93.184.216.34/hook", "event_types": ["batch.failed"]})
    assert hook.status_code == 200, hook.get_data(as_text=True)
    with ctx.db.session() as s:  # an event of A's, so that its endpoint has a delivery
        assert webhooks.emit(ctx, s, a_project, "batch.failed", batch.get_json()["id"])
    delivery = a.get(f"/v1/webhook_endpoints/{hook.get_json()['id']}/deliveries").get_json()
    up = a.post("/v1/uploads", json={"bytes": 3, "filename": "a.jsonl",
                                     "mime_type": "application/jsonl", "purpose": "batch"})
    assert up.status_code == 200, up.get_data(as_text=True)
    part = a.post(f"/v1/uploads/{up.get_json()['id']}/parts",
                  data={"data": (io.BytesIO(b"{}\n"), "blob")})
    assert part.status_code == 200, part.get_data(as_text=True)
    return {"upload_id": up.get_json()["id"], "part_id": part.get_json()["id"],
            "file_id": fid, "batch_id": batch.get_json()["id"], "job_id": job.get_json()["id"],
            "webhook_endpoint_id": hook.get_json()["id"],
            "delivery_id": delivery["data"][0]["id"],
            "service_account_id": sa.id, "api_key_id": key.key.id, "a_project_id": a_project,
            "a_key": key.value,
            "b_project_id": auth.authenticate(ctx, other_tenant_key).tenant_id}


@pytest.mark.parametrize("method,rule", sorted(COVERED))
def test_another_projects_id_is_not_found(app: Any, ctx: Context, a_objects: dict[str, str],
                                          other_tenant_key: str, admin_key: str,
                                          tenant_key: str, method: str, rule: str) -> None:
    path = COVERED[(method, rule)].format(**a_objects)
    admin = rule.startswith("/v1/organization/")
    b = as_key(app, admin_key if admin else other_tenant_key)
    a_admin = as_key(app, admin_key)
    a_keys = f"{ORG}/{a_objects['a_project_id']}/api_keys?limit=100"
    keys_before = [k["id"] for k in a_admin.get(a_keys).get_json()["data"]]
    assert a_objects["api_key_id"] in keys_before
    body: dict[str, Any] | None = {} if method == "POST" else None
    resp = b.open(path, method=method, json=body)
    assert resp.status_code == 404, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    # and nothing of A's changed: its objects are there, as they were
    a = as_key(app, tenant_key)
    assert a.get(f"/v1/files/{a_objects['file_id']}").status_code == 200
    assert a.get(f"/v1/batches/{a_objects['batch_id']}").get_json()["status"] in (
        "validating", "in_progress", "completed", "failed")
    assert [k["id"] for k in a_admin.get(a_keys).get_json()["data"]] == keys_before
    sa = f"{ORG}/{a_objects['a_project_id']}/service_accounts/{a_objects['service_account_id']}"
    assert a_admin.get(sa).status_code == 200
    assert as_key(app, a_objects["a_key"]).get("/v1/models").status_code == 200
    with ctx.db.session() as s:  # A's upload: pending, with its one part
        up = s.get(Upload, a_objects["upload_id"])
        assert up is not None and up.status == "pending"
        assert [p.id for p in s.scalars(select(UploadPart).where(
            UploadPart.upload_id == up.id))] == [a_objects["part_id"]]


def test_listings_never_show_another_projects_objects(app: Any, a_objects: dict[str, str],
                                                      other_tenant_key: str,
                                                      admin_key: str) -> None:
    b = as_key(app, other_tenant_key)
    a_ids = set(a_objects.values())
    for path in ("/v1/files?limit=100", "/v1/batches?limit=100",
                 "/v1/webhook_endpoints?limit=100"):
        got = b.get(path)
        assert got.status_code == 200
        assert not {x["id"] for x in got.get_json()["data"]} & a_ids, path
    admin = as_key(app, admin_key)
    for what in ("api_keys", "service_accounts"):
        got = admin.get(f"{ORG}/{a_objects['b_project_id']}/{what}?limit=100")
        assert got.status_code == 200
        assert not {x["id"] for x in got.get_json()["data"]} & a_ids, what
    # a cursor of A's is no cursor of B's
    for path in (f"/v1/files?after={a_objects['file_id']}",
                 f"/v1/batches?after={a_objects['batch_id']}",
                 f"/v1/webhook_endpoints?after={a_objects['webhook_endpoint_id']}"):
        assert b.get(path).status_code == 400, path
    got = admin.get(f"{ORG}/{a_objects['b_project_id']}/api_keys?after="
                    f"{a_objects['api_key_id']}")
    assert got.status_code == 400 and got.get_json()["error"]["param"] == "after"


def test_limits_are_per_project(app: Any, a_objects: dict[str, str], admin_key: str) -> None:
    admin = as_key(app, admin_key)
    rl = "rl-all-MiniLM-L6-v2"
    set_a = admin.post(f"{ORG}/{a_objects['a_project_id']}/rate_limits/{rl}",
                       json={"max_requests_per_1_day": 123})
    assert set_a.status_code == 200 and set_a.get_json()["max_requests_per_1_day"] == 123
    b_limits = admin.get(f"{ORG}/{a_objects['b_project_id']}/rate_limits").get_json()["data"]
    mine = [x for x in b_limits if x["id"] == rl]
    assert mine and mine[0]["max_requests_per_1_day"] is None
