"""/openapi.json against the app itself: every route is described, the description is
valid OpenAPI 3.1, and requests schemathesis generates from it (a few per operation,
derandomized) get no 5xx and answers that conform to it: a documented status, content
type and body schema; never a 500. The app runs on a database and Redis DB of this module's own,
with no model worker: the inference routes answer 503 at once (no worker serves the
realtime lane), so every operation is exercised, streams included."""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.core import NOT_SET
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.routes.openapi import _ARG
from jobs.fleet import builtin_models, registry
from jobs.tenants import auth
from tests.conftest import fresh_database

EXAMPLES = 5
CHAT_MODEL = "openapi-chat"
# Not negative_data_rejection: unknown query parameters are ignored by design
# (test_bad_input.py), and every request here carries a key, which its schema may not.
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]


@pytest.fixture(scope="module")
def world(settings, pg_admin_url, redis_dbs) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """An app on a database, Redis DB and object-store prefix of this module's own, a
    project key and an admin key of it."""
    from api.app import create_app

    with fresh_database(pg_admin_url) as url, redis_dbs.lend() as redis_url:
        st = settings.model_copy(update={
            "database_url": url, "redis_url": redis_url, "events_poll_s": 0.1,
            "events_max_s": 0.3,  # a stream of a batch that runs ends at once
            "object_store_url": f"{settings.object_store_url}-openapi-{secrets.token_hex(3)}"})
        app = create_app(st)
        ctx = app.extensions["inferq"]
        builtin_models.register_builtin_models(ctx)
        # a chat model in the registry only (no files, no worker): requests for it are
        # valid and reach the point where no worker serves them
        registry.register(ctx, CHAT_MODEL, "1", registry.CHAT_KIND, "test", [], 2048)
        key = auth.create_tenant(ctx, "openapi")[1]
        admin = f"iq-admin-{secrets.token_urlsafe(16)}"
        auth.ensure_admin_key(ctx, admin)
        yield {"app": app, "key": key, "admin": admin}
        ctx.close()


@pytest.fixture(scope="module")
def api_schema(world):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_wsgi("/openapi.json", world["app"])


@pytest.fixture(scope="module")
def ids(world) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Real objects, by path parameter: requests about them get success answers."""
    c = world["app"].test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {world['key']}"
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": ' \
        b'{"model": "all-MiniLM-L6-v2", "input": "hi"}}\n'
    f = c.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(line), "in.jsonl")})
    b = c.post("/v1/batches", json={"input_file_id": f.get_json()["id"],
                                    "endpoint": "/v1/embeddings", "completion_window": "24h"})
    job = c.post("/v1/jobs", json={"endpoint": "/v1/embeddings", "body": {
        "model": "all-MiniLM-L6-v2", "input": "hi"}})
    hook = c.post("/v1/webhook_endpoints", json={  # a public address: no DNS needed
        "name": "h", "url": "https://93.184.216.34/hook", "event_types": ["batch.failed"]})
    assert c.post("/v1/webhook_callback_secret").status_code == 200
    admin = {"Authorization": f"Bearer {world['admin']}"}
    org = "/v1/organization/projects"
    proj = c.post(org, json={"name": "openapi-p"}, headers=admin).get_json()["id"]
    sa = c.post(f"{org}/{proj}/service_accounts", json={"name": "sa"}, headers=admin)
    limits = c.get(f"{org}/{proj}/rate_limits", headers=admin).get_json()["data"]
    up = c.post("/v1/uploads", json={"bytes": len(line), "filename": "in.jsonl",
                                     "mime_type": "application/jsonl", "purpose": "batch"})
    for r in (f, b, job, hook, sa, up):
        assert r.status_code == 200, r.get_data(as_text=True)
    return {"file_id": f.get_json()["id"], "batch_id": b.get_json()["id"],
            "job_id": job.get_json()["id"], "webhook_endpoint_id": hook.get_json()["id"],
            "model_id": "all-MiniLM-L6-v2", "project_id": proj,
            "service_account_id": sa.get_json()["id"],
            "api_key_id": sa.get_json()["api_key"]["id"], "rate_limit_id": limits[0]["id"],
            "upload_id": up.get_json()["id"], "asset": "app.js"}


def test_every_route_is_described(world) -> None:  # type: ignore[no-untyped-def]
    doc = world["app"].test_client().get("/openapi.json").get_json()
    for rule in world["app"].url_map.iter_rules():
        path = _ARG.sub(r"{\1}", rule.rule)
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            assert method.lower() in doc["paths"].get(path, {}), (method, rule.rule)
    ops = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
    assert len(ops) == sum(len(item) for item in doc["paths"].values())  # ids are unique
    undescribed = {e for e, op in ops.items() if "default" in op["responses"]}
    # every answer is described (its model or media), but the dashboard's own page data
    assert {e.split(".")[0] for e in undescribed} <= {"dashboard", "ui"}, undescribed
    assert "default" not in ops["batches.create"]["responses"]  # its errors are listed
    assert {"400", "401", "404", "409", "413", "503"} <= set(ops["batches.create"]["responses"])
    assert {"401", "403"} <= set(ops["admin.list_projects"]["responses"])
    chat = ops["inference.chat_completions"]["responses"]["200"]["content"]
    assert set(chat) == {"application/json", "text/event-stream"}
    answer = ops["inference.responses"]["responses"]["200"]["content"]
    assert set(answer) == {"application/json", "text/event-stream"}
    assert answer["application/json"]["schema"]["$ref"].endswith("/ResponseObject")
    upload = ops["files.create"]["requestBody"]["content"]
    assert list(upload) == ["multipart/form-data"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header"
               for p in ops["files.create"]["parameters"])


def test_the_description_is_valid_openapi(world) -> None:  # type: ignore[no-untyped-def]
    doc = world["app"].test_client().get("/openapi.json").get_json()
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_docs_lists_every_operation(world) -> None:  # type: ignore[no-untyped-def]
    c = world["app"].test_client()
    doc = c.get("/openapi.json").get_json()
    page = c.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert "http://" not in html.replace("http://localhost", "") and "https://" not in html
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert f'id="op-{op["operationId"]}"' in html, (method, path)
            assert path.replace("<", "&lt;") in html
    assert 'id="schema-BatchObject"' in html and "request_counts" in html


def real_bodies(ids: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Bodies that name real objects, by operation: creates that succeed, and requests
    the inference routes take up to the point where no worker serves them (503)."""
    emb = {"model": "all-MiniLM-L6-v2", "input": "hi"}
    chat = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return {"batches.create": {"input_file_id": ids["file_id"], "endpoint": "/v1/embeddings",
                               "completion_window": "24h"},
            "jobs.create": {"endpoint": "/v1/embeddings", "body": emb},
            "uploads.create": {"bytes": 10, "filename": "in.jsonl",
                               "mime_type": "application/jsonl", "purpose": "batch"},
            "webhooks.create": {"name": "w", "url": "https://93.184.216.34/w",
                                "event_types": ["job.failed"]},
            "inference.embeddings": emb, "inference.chat_completions": {**chat, "stream": True},
            "inference.completions": {"model": chat["model"], "prompt": "hi"},
            "inference.responses": {"model": CHAT_MODEL, "input": "hi", "stream": True}}


def _examples(operation: Any, mode: GenerationMode, call: Any,
              path: dict[str, str] | None = None, body: Any = NOT_SET) -> None:
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path, body=body))
    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate],  # the first failure, unshrunk
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        call(case)

    run()


def test_answers_conform_to_the_description(world, api_schema, ids) -> None:  # type: ignore[no-untyped-def]
    """A few valid and a few invalid requests per operation, with the admin key on the
    Admin API and /metrics and the project key everywhere else; then valid ones about real objects
    (their ids in the path), so the success answers are checked too."""
    def call(case: Any) -> None:
        admin = case.path.startswith("/v1/organization/") or case.path == "/metrics"
        key = world["admin"] if admin else world["key"]
        response = case.call(headers={"Authorization": f"Bearer {key}"})
        seen.setdefault(case.operation.definition.raw.get("operationId"), set()).add(
            response.status_code)
        # 503 (no worker, documented where it can happen) is an answer; 500 never is
        assert response.status_code not in (500, 502), case.as_curl_command()
        case.validate_response(response, checks=CHECKS)

    failures: list[str] = []
    seen: dict[str, set[int]] = {}  # operation id -> the statuses it answered with
    bodies = real_bodies(ids)
    operations = [result.ok() for result in api_schema.get_all_operations()]
    # what removes an object last: requests about it before get success answers
    for operation in sorted(operations, key=lambda o: o.method.upper() == "DELETE"
                            or o.path.endswith("/archive")):
        names = [p.name for p in operation.path_parameters]
        real = {n: ids[n] for n in names if n in ids} if names else None
        runs: list[tuple[GenerationMode, dict[str, str] | None]] = [
            (GenerationMode.POSITIVE, None), (GenerationMode.NEGATIVE, None)]
        if real is not None and len(real) == len(names):
            runs.append((GenerationMode.POSITIVE, real))
        body = bodies.get(operation.definition.raw.get("operationId"), NOT_SET)
        if body is not NOT_SET:
            runs.append((GenerationMode.POSITIVE, real))
        for i, (mode, path) in enumerate(runs):
            try:
                _examples(operation, mode, call, path, body if i == len(runs) - 1 else NOT_SET)
            except Unsatisfiable:  # nothing to send that breaks the schema (no parameters)
                pass
            except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - all are reported
                failures.append(f"{operation.label} ({mode}): {e}")
    assert len(seen) >= 40
    succeeded = {op for op, codes in seen.items() if any(c < 300 for c in codes)}
    assert {"files.retrieve", "files.content", "batches.retrieve", "batches.events",
            "jobs.retrieve", "webhooks.retrieve", "webhooks.rotate_secret", "models.retrieve",
            "admin.retrieve_project", "admin.retrieve_key", "usage.costs",
            "batches.create", "jobs.create", "webhooks.create", "health.metrics",
            "uploads.create", "uploads.cancel"} <= succeeded
    for op in ("inference.embeddings", "inference.chat_completions", "inference.completions"):
        assert 503 in seen[op], seen[op]  # no worker: refused at once, a stream included
    assert not failures, "\n\n".join(failures)
