"""Malformed input, sent to every route the app serves: a 4xx in the OpenAI error shape,
never a 5xx (real PostgreSQL, Redis and S3 behind the Flask app; no worker needed:
every request here is refused before one would be)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.helpers import emb_line, jsonl

EMB = {"model": "all-MiniLM-L6-v2", "input": "hello"}
CHAT = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}
BODIES: dict[str, dict[str, Any]] = {
    "batches.create": {"input_file_id": "file-x", "endpoint": "/v1/embeddings",
                       "completion_window": "24h"},
    "inference.embeddings": EMB,
    "inference.chat_completions": CHAT,
    "inference.completions": {"model": "SmolLM2-135M-Instruct", "prompt": "hi"},
    "inference.responses": {"model": "SmolLM2-135M-Instruct", "input": "hi"},
    "jobs.create": {"endpoint": "/v1/chat/completions", "body": CHAT},
    "uploads.create": {"bytes": 10, "filename": "in.jsonl", "mime_type": "application/jsonl",
                       "purpose": "batch"},
}
LISTS = ("batches.list_", "files.list_", "admin.list_projects", "webhooks.list_")
CREATES = ("batches.create", "files.create", "jobs.create", "uploads.create")
PATH_ARGS = ("model_id", "asset")  # the arguments of <path:...> rules
ROUTES = {  # every route of the app: (method, url rule) -> view; a new one must be added
    ("POST", "/v1/files"): "files.create", ("GET", "/v1/files"): "files.list_",
    ("GET", "/v1/files/<file_id>"): "files.retrieve",
    ("GET", "/v1/files/<file_id>/content"): "files.content",
    ("DELETE", "/v1/files/<file_id>"): "files.delete",
    ("POST", "/v1/uploads"): "uploads.create",
    ("POST", "/v1/uploads/<upload_id>/parts"): "uploads.add_part",
    ("POST", "/v1/uploads/<upload_id>/complete"): "uploads.complete",
    ("POST", "/v1/uploads/<upload_id>/cancel"): "uploads.cancel",
    ("POST", "/v1/batches"): "batches.create", ("GET", "/v1/batches"): "batches.list_",
    ("GET", "/v1/batches/<batch_id>"): "batches.retrieve",
    ("POST", "/v1/batches/<batch_id>/cancel"): "batches.cancel",
    ("GET", "/v1/batches/<batch_id>/events"): "batches.events",
    ("GET", "/v1/batches/<batch_id>/output"): "batches.output",
    ("POST", "/v1/batches/<batch_id>/retry"): "batches.retry_",
    ("GET", "/v1/batches/<batch_id>/merged_output"): "batches.merged_output",
    ("POST", "/v1/embeddings"): "inference.embeddings",
    ("POST", "/v1/chat/completions"): "inference.chat_completions",
    ("POST", "/v1/completions"): "inference.completions",
    ("POST", "/v1/responses"): "inference.responses",
    ("POST", "/v1/jobs"): "jobs.create", ("GET", "/v1/jobs/<job_id>"): "jobs.retrieve",
    ("POST", "/v1/webhook_endpoints"): "webhooks.create",
    ("GET", "/v1/webhook_endpoints"): "webhooks.list_",
    ("GET", "/v1/webhook_endpoints/<webhook_endpoint_id>"): "webhooks.retrieve",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>"): "webhooks.update",
    ("DELETE", "/v1/webhook_endpoints/<webhook_endpoint_id>"): "webhooks.delete",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>/rotate_secret"):
        "webhooks.rotate_secret",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>/test"): "webhooks.test",
    ("GET", "/v1/webhook_endpoints/<webhook_endpoint_id>/deliveries"): "webhooks.deliveries",
    ("POST", "/v1/webhook_endpoints/<webhook_endpoint_id>/deliveries/<delivery_id>/resend"):
        "webhooks.resend",
    ("GET", "/v1/webhook_event_types"): "webhooks.event_types",
    ("GET", "/v1/webhook_callback_secret"): "webhooks.callback_secret",
    ("POST", "/v1/webhook_callback_secret"): "webhooks.rotate_callback_secret",
    ("GET", "/v1/models"): "models.list_", ("GET", "/v1/models/<path:model_id>"): "models.retrieve",
    ("GET", "/v1/dashboard/overview"): "dashboard.overview",
    ("GET", "/v1/dashboard/batches/<batch_id>"): "dashboard.batch",
    ("GET", "/dashboard"): "ui.page", ("GET", "/dashboard/static/<path:asset>"): "ui.asset",
    ("GET", "/healthz"): "health.healthz", ("GET", "/readyz"): "health.readyz",
    ("GET", "/metrics"): "health.metrics", ("GET", "/openapi.json"): "openapi.openapi",
    ("GET", "/docs"): "openapi.docs",
    # the Admin API (admin key: see send)
    ("POST", "/v1/organization/projects"): "admin.create_project",
    ("GET", "/v1/organization/projects"): "admin.list_projects",
    ("GET", "/v1/organization/projects/<project_id>"): "admin.retrieve_project",
    ("POST", "/v1/organization/projects/<project_id>"): "admin.update_project",
    ("POST", "/v1/organization/projects/<project_id>/archive"): "admin.archive_project",
    ("POST", "/v1/organization/projects/<project_id>/service_accounts"):
        "admin.create_service_account",
    ("GET", "/v1/organization/projects/<project_id>/service_accounts"):
        "admin.list_service_accounts",
    ("GET", "/v1/organization/projects/<project_id>/service_accounts/<service_account_id>"):
        "admin.retrieve_service_account",
    ("DELETE", "/v1/organization/projects/<project_id>/service_accounts/<service_account_id>"):
        "admin.delete_service_account",
    ("POST", "/v1/organization/projects/<project_id>/service_accounts/<service_account_id>"
             "/api_keys"): "admin.create_key",
    ("GET", "/v1/organization/projects/<project_id>/api_keys"): "admin.list_keys",
    ("GET", "/v1/organization/projects/<project_id>/api_keys/<api_key_id>"):
        "admin.retrieve_key",
    ("DELETE", "/v1/organization/projects/<project_id>/api_keys/<api_key_id>"):
        "admin.delete_key",
    ("GET", "/v1/organization/projects/<project_id>/rate_limits"): "admin.list_rate_limits",
    ("POST", "/v1/organization/projects/<project_id>/rate_limits/<rate_limit_id>"):
        "admin.update_rate_limit",
    ("POST", "/v1/organization/projects/<project_id>/data_locations"): "admin.create_location",
    ("GET", "/v1/organization/projects/<project_id>/data_locations"): "admin.list_locations",
    ("DELETE", "/v1/organization/projects/<project_id>/data_locations/<location_id>"):
        "admin.delete_location",
    ("GET", "/v1/organization/usage/completions"): "usage.completions",
    ("GET", "/v1/organization/usage/embeddings"): "usage.embeddings",
    ("GET", "/v1/organization/costs"): "usage.costs",
    ("GET", "/v1/organization/models"): "fleet.list_",
    ("GET", "/v1/organization/models/<name>/rollout"): "fleet.get",
    ("POST", "/v1/organization/models/<name>/rollout"): "fleet.step",
    ("POST", "/v1/organization/models/<name>/versions/<version>/pool"): "fleet.pool",
    ("POST", "/v1/organization/models"): "fleet.add",
    ("DELETE", "/v1/organization/models/<name>/versions/<version>"): "fleet.remove",
}


@dataclass
class Req:
    """One request to send: a route's path (``{}`` where its id goes), query, headers, body."""

    method: str
    path: str
    view: str
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    data: Any = None
    content_type: str | None = None

    @property
    def arg(self) -> str | None:
        return self.path[self.path.index("<") + 1:self.path.index(">")].split(":")[-1] \
            if "<" in self.path else None


def route_requests() -> list[Req]:
    return [Req(method, rule, view) for (method, rule), view in ROUTES.items()]


def json_req(r: Req, raw: bytes) -> Req:
    r.data, r.content_type = raw, "application/json"
    return r


def with_body(r: Req, change: Callable[[dict[str, Any]], None]) -> Req:
    body = json.loads(json.dumps(BODIES[r.view]))
    change(body)
    return json_req(r, json.dumps(body).encode())


def nested(depth: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for _ in range(depth):
        d = {"a": d}
    return d


def deep_field(r: Req) -> Req:
    return with_body(r, lambda b: b.update({"user" if "model" in b else "body": nested(500)}))


def multipart(r: Req, raw: bytes, boundary: str | None = "XyZ") -> Req:
    r.data = raw
    r.content_type = "multipart/form-data" + (f"; boundary={boundary}" if boundary else "")
    return r


def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--XyZ\r\nContent-Disposition: {disp}\r\n\r\n".encode() + value + b"\r\n"


GOOD_FILE = part("purpose", b"batch") + part("file", b'{"a": 1}\n', "in.jsonl")
Kind = tuple[Callable[[Req], bool], Callable[[Req, dict[str, str]], Req], int | None]
is_json: Callable[[Req], bool] = lambda r: r.view in BODIES  # noqa: E731
is_v1: Callable[[Req], bool] = lambda r: r.path.startswith("/v1/")  # noqa: E731
has_id: Callable[[Req], bool] = lambda r: r.arg is not None  # noqa: E731
is_list: Callable[[Req], bool] = lambda r: r.view in LISTS  # noqa: E731


def path_id(value: str) -> Callable[[Req, dict[str, str]], Req]:
    def build(r: Req, ids: dict[str, str]) -> Req:
        r.path = r.path.replace(f"<{'path:' if r.arg in PATH_ARGS else ''}{r.arg}>", value)
        return r
    return build


def query(q: str) -> Callable[[Req, dict[str, str]], Req]:
    def build(r: Req, ids: dict[str, str]) -> Req:
        r.query = q.format(**ids)
        return r
    return build


def header(name: str, value: str) -> Callable[[Req, dict[str, str]], Req]:
    def build(r: Req, ids: dict[str, str]) -> Req:
        r.headers[name] = value
        if r.view == "files.create":
            return multipart(r, GOOD_FILE + b"--XyZ--\r\n")
        return json_req(r, json.dumps(BODIES[r.view]).encode()) if is_json(r) else r
    return build


def body(change: Callable[[dict[str, Any]], None]) -> Callable[[Req, dict[str, str]], Req]:
    return lambda r, ids: with_body(r, change)


def raw_json(raw: bytes) -> Callable[[Req, dict[str, str]], Req]:
    return lambda r, ids: json_req(r, raw)


def upload(raw: bytes, boundary: str | None = "XyZ") -> Callable[[Req, dict[str, str]], Req]:
    return lambda r, ids: multipart(r, raw, boundary)


def field_of_request(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a field of the request body (of a job's ``body``)."""
    def change(b: dict[str, Any]) -> None:
        (b["body"] if isinstance(b.get("body"), dict) else b)[key] = value
    return change


is_upload: Callable[[Req], bool] = lambda r: r.view == "files.create"  # noqa: E731
is_generation: Callable[[Req], bool] = lambda r: r.view in (  # noqa: E731
    "inference.chat_completions", "inference.completions", "jobs.create")
is_sampling: Callable[[Req], bool] = lambda r: (  # noqa: E731
    is_generation(r) or r.view == "batches.create")
KINDS: dict[str, Kind] = {
    # paths
    "id_nul": (has_id, path_id("batch_%00abc"), 404),
    "id_control_char": (has_id, path_id("file-%01%1b"), 404),
    "id_invalid_utf8": (has_id, path_id("job_%ff%fe%80"), 404),
    "id_overlong": (has_id, path_id("x" * 5000), 404),
    "id_non_ascii": (has_id, path_id("b%C3%A4tch_%E2%80%AE"), 404),
    "id_sql": (has_id, path_id("x'%20OR%201=1--"), 404),
    "id_other_tenant": (has_id, lambda r, ids: path_id(ids[r.arg or ""])(r, ids), 404),
    "id_unknown": (has_id, path_id("batch_0123456789abcdef"), 404),
    # query
    "limit_negative": (is_list, query("limit=-1"), 400),
    "limit_huge": (is_list, query("limit=" + "9" * 40), 400),
    "limit_digits_overflow": (is_list, query("limit=" + "9" * 5000), 400),
    "limit_nul": (is_list, query("limit=1%00"), 400),
    "limit_float": (is_list, query("limit=1.5"), 400),
    "after_nul": (is_list, query("after=batch_%00"), 400),
    "after_invalid_utf8": (is_list, query("after=%ff%fe"), 400),
    "after_unknown": (is_list, query("after=file-0123456789abcdef"), 400),
    "after_other_tenant": (is_list, query("after={other_list_item}"), 400),
    "purpose_nul": (lambda r: r.view == "files.list_", query("purpose=ba%00tch"), 400),
    # headers
    "auth_nul": (is_v1, header("Authorization", "Bearer iq-\x00"), 401),
    "auth_latin1": (is_v1, header("Authorization", "Bearer \xff\xfe"), 401),
    "auth_scheme": (is_v1, header("Authorization", "Basic Zm9vOmJhcg=="), 401),
    "idempotency_key_nul": (lambda r: r.view in CREATES,
                            header("Idempotency-Key", "k\x00"), 400),
    "idempotency_key_overlong": (lambda r: r.view in CREATES,
                                 header("Idempotency-Key", "k" * 300), 400),
    "last_event_id_bad": (lambda r: r.view == "batches.events",
                          header("Last-Event-ID", "1-x\x00"), 400),
    "content_type_text": (is_json, lambda r, ids: Req(
        r.method, r.path, r.view, data=json.dumps(BODIES[r.view]), content_type="text/plain"),
        400),
    # JSON bodies
    "body_invalid_utf8": (is_json, raw_json(b'{"model": "\xff\xfe"}'), 400),
    "body_lone_surrogate": (is_json, raw_json(b'{"model": "\\ud800"}'), 400),
    "body_deep_nesting": (is_json, raw_json(b"[" * 50_000), 400),
    "body_deep_field": (is_json, lambda r, ids: deep_field(r), 400),
    "body_truncated": (is_json, raw_json(b'{"model": "x", "input": '), 400),
    "body_empty": (is_json, raw_json(b""), 400),
    "body_not_object": (is_json, raw_json(b'["model"]'), 400),
    "body_null": (is_json, raw_json(b"null"), 400),
    "body_nan": (is_json, raw_json(b'{"model": NaN}'), 400),
    "body_float_overflow": (is_json, raw_json(b'{"temperature": 1e400}'), 400),
    "body_nul_value": (is_json, body(lambda b: b.update(
        {k: "a\x00b" for k in b if isinstance(b[k], str)})), 400),
    "body_nul_key": (is_json, body(lambda b: b.update({"x\x00": 1})), 400),
    "body_nul_nested": (is_json, body(lambda b: b.update({"metadata": {"k": "\x00"}})), 400),
    "body_wrong_types": (is_json, body(lambda b: b.update(
        {k: 12 for k in ("model", "endpoint", "input_file_id", "filename") if k in b})), 400),
    "body_oversized_field": (is_json, body(lambda b: b.update(
        {k: "m" * 100_000 for k in ("model", "input_file_id") if k in b}
        or {"endpoint": "/" + "e" * 100_000})), 400),
    "body_huge_int": (is_sampling, body(field_of_request("seed", 10**40)), 400),
    "body_int64_overflow": (is_sampling, body(field_of_request("seed", 2**63)), 400),
    "body_huge_max_tokens": (is_sampling, body(field_of_request("max_tokens", 2**62)), 400),
    "body_bool_for_list": (is_generation, body(lambda b: b.update(
        {k: True for k in ("messages", "prompt") if k in b}) if "body" not in b
        else b["body"].update(messages=True)), 400),
    "body_message_not_object": (is_generation, body(lambda b: (b.get("body") or b).update(
        {k: v for k, v in (("messages", ["hi"]), ("prompt", ["a", "b"])) if k in
         (b.get("body") or b)})), 400),
    "body_defaults_wrong_type": (lambda r: r.view == "batches.create", body(lambda b: b.update(
        {"body": {"model": ["x"]}})), None),  # 404: the file is looked up first
    "body_metadata_wrong_type": (lambda r: r.view == "batches.create", body(lambda b: b.update(
        {"metadata": {"k": 1}})), 400),
    "body_message_parts_wrong": (lambda r: r.view in ("inference.chat_completions",
                                                      "jobs.create"), body(field_of_request(
        "messages", [{"role": "robot", "content": [1]}])), 400),
    "body_input_items_wrong": (lambda r: r.view == "inference.responses", body(
        field_of_request("input", [{"role": "robot", "content": [1]}])), 400),
    "body_token_id_huge": (lambda r: r.view == "inference.embeddings",
                           body(field_of_request("input", [[2**40]])), 400),
    # uploads
    "upload_no_boundary": (is_upload, upload(GOOD_FILE + b"--XyZ--\r\n", None), 400),
    "upload_truncated": (is_upload, upload(GOOD_FILE[:-20]), 400),
    "upload_garbage": (is_upload, upload(b"\x00\xff" * 100), 400),
    "upload_filename_nul": (is_upload, upload(
        part("purpose", b"batch") + part("file", b"{}\n", "a\x00b.jsonl") + b"--XyZ--\r\n"),
        400),
    "upload_purpose_nul": (is_upload, upload(
        part("purpose", b"bat\x00ch") + part("file", b"{}\n", "a.jsonl") + b"--XyZ--\r\n"),
        400),
    "upload_purpose_invalid_utf8": (is_upload, upload(
        part("purpose", b"\xff\xfe") + part("file", b"{}\n", "a.jsonl") + b"--XyZ--\r\n"),
        400),
    "upload_no_file": (is_upload, upload(part("purpose", b"batch") + b"--XyZ--\r\n"), 400),
    "upload_empty_file": (is_upload, upload(
        part("purpose", b"batch") + part("file", b"", "a.jsonl") + b"--XyZ--\r\n"), 400),
    "upload_as_json": (is_upload, raw_json(b'{"file": "x", "purpose": "batch"}'), 400),
}
CASES = [pytest.param(kind, r.method, r.path, id=f"{kind}-{r.method} {r.path}")
         for kind, (applies, _, _) in KINDS.items() for r in route_requests() if applies(r)]


def send(client: Any, r: Req, admin_key: str | None = None) -> Any:
    """``admin_key``: the key Admin API routes get unless the request sets its own."""
    url = r.path + (f"?{r.query}" if r.query else "")
    headers = r.headers
    if admin_key and r.path.startswith("/v1/organization/") and "Authorization" not in headers:
        headers = {**headers, "Authorization": f"Bearer {admin_key}"}
    return client.open(url, method=r.method, headers=headers, data=r.data,
                       content_type=r.content_type)


def assert_error_shape(resp: Any) -> dict[str, Any]:
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"].strip()
    return err  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def ids(app, tenant_key, other_tenant_key) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Objects of another tenant, by path argument, and one of its list items."""
    other = app.test_client()
    other.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {other_tenant_key}"
    fid = other.post("/v1/files", content_type="multipart/form-data", data={
        "file": (io.BytesIO(jsonl([emb_line(0, "x")])), "in.jsonl"), "purpose": "batch",
    }).get_json()["id"]
    bid = other.post("/v1/batches", json={**BODIES["batches.create"],
                                          "input_file_id": fid}).get_json()["id"]
    job = other.post("/v1/jobs", json={"endpoint": "/v1/embeddings", "body": EMB})
    assert job.status_code == 200, job.get_data(as_text=True)
    hook = other.post("/v1/webhook_endpoints", json={  # a public address: no DNS needed
        "name": "other", "url": "https://93.184.216.34/hook", "event_types": ["batch.failed"]})
    assert hook.status_code == 200, hook.get_data(as_text=True)
    up = other.post("/v1/uploads", json=BODIES["uploads.create"])
    assert up.status_code == 200, up.get_data(as_text=True)
    return {"file_id": fid, "batch_id": bid, "job_id": job.get_json()["id"],
            "upload_id": up.get_json()["id"],
            "webhook_endpoint_id": hook.get_json()["id"],
            "model_id": "batch_" + "0" * 20, "other_list_item": bid,
            "asset": "no-such-asset.js",  # the dashboard's files: one it does not have
            # the admin key sees every project: an id of none
            "project_id": "proj_" + "0" * 26,
            "name": "no-such-model-" + "0" * 8}  # models are the service's: one it lacks


def test_the_table_covers_every_route(app) -> None:  # type: ignore[no-untyped-def]
    served = {(m, rule.rule): rule.endpoint for rule in app.url_map.iter_rules()
              if rule.endpoint != "static" for m in (rule.methods or set()) - {"HEAD", "OPTIONS"}}
    assert served == ROUTES


@pytest.mark.parametrize("kind,method,path", CASES)
def test_bad_input_is_a_client_error(client, ids, admin_key, kind: str, method: str,  # type: ignore[no-untyped-def]
                                     path: str) -> None:
    _, build, status = KINDS[kind]
    r = build(Req(method, path, ROUTES[(method, path)]), ids)
    if kind == "after_other_tenant" and r.view == "files.list_":
        r.query = f"after={ids['file_id']}"
    if r.arg:  # kinds about other parts of the request: any id will do
        r.path = r.path.replace(f"<{'path:' if r.arg in PATH_ARGS else ''}{r.arg}>", "x_1")
    resp = send(client, r, admin_key)
    assert 400 <= resp.status_code < 500, resp.get_data(as_text=True)[:500]
    if status is not None:
        assert resp.status_code == status, resp.get_data(as_text=True)[:500]
    err = assert_error_shape(resp)
    if kind.startswith("body_"):  # refused for what is wrong, not for a model not deployed here
        assert err["code"] != "model_not_found", err


@pytest.mark.parametrize("method,path", list(ROUTES))
def test_junk_a_route_does_not_read_changes_nothing(client, ids, admin_key, method: str,  # type: ignore[no-untyped-def]
                                                    path: str) -> None:
    """Unknown query parameters and headers with NUL, control and non-ASCII characters
    are ignored: the answer is the one the route gives without them."""
    r = Req(method, path, ROUTES[(method, path)])
    if r.arg:
        r.path = r.path.replace(f"<{'path:' if r.arg in PATH_ARGS else ''}{r.arg}>",
                                "all-MiniLM-L6-v2" if r.arg == "model_id" else "x_unknown")
    clean = send(client, r, admin_key)
    r.query, r.headers = "x=%00%ff&y=\x01", {"X-Junk": "\x00\x7f\xff", "Accept": "\x00"}
    junk = send(client, r, admin_key)
    assert junk.status_code == clean.status_code, junk.get_data(as_text=True)[:500]
    assert junk.status_code < 500 or path in ("/healthz", "/readyz")
    if junk.status_code >= 400 and path.startswith("/v1/"):
        assert_error_shape(junk)


def test_liveness_needs_nothing_and_readiness_says_what_it_serves(settings, own_redis_url) -> None:  # type: ignore[no-untyped-def]
    """On a Redis DB no worker heartbeats into (a session stack's workers may be live
    on the session's): alive, and ready to take work (batches and jobs wait for
    workers), serving no lane; ready for a lane only with a live worker on it."""
    from api.app import create_app

    client = create_app(settings.model_copy(update={"redis_url": own_redis_url})).test_client()
    health = client.get("/healthz")
    assert health.status_code == 200 and health.get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.get_data(as_text=True)
    body = ready.get_json()
    assert body["status"] == "ok" and body["checks"]["workers"] == 0
    assert body["checks"]["database"] == body["checks"]["redis"] == "ok"
    assert body["checks"]["lanes"] == {"realtime": 0, "jobs": 0, "batch": 0, "flex": 0}
    assert body["checks"]["models"] == {"realtime": [], "jobs": [], "batch": [], "flex": []}
    for query in ("?lane=realtime", "?lane=batch&lane=flex", "?lane=jobs,batch"):
        got = client.get("/readyz" + query)
        assert got.status_code == 503 and got.get_json()["status"] == "unavailable", query
        assert got.get_json()["checks"] == body["checks"]
    bad = client.get("/readyz?lane=gpu")
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "lane"



def test_openapi_describes_the_served_routes(client, app) -> None:  # type: ignore[no-untyped-def]
    doc = client.get("/openapi.json").get_json()
    paths = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert paths == {(m, rule.replace("<path:", "{").replace("<", "{").replace(">", "}"))
                     for m, rule in ROUTES}
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    ref = chat["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert "messages" in doc["components"]["schemas"][ref]["properties"]


def test_unknown_after_is_refused_and_a_known_one_pages(client) -> None:  # type: ignore[no-untyped-def]
    for i in range(3):
        client.post("/v1/files", content_type="multipart/form-data", data={
            "file": (io.BytesIO(jsonl([emb_line(i, "x")])), "in.jsonl"), "purpose": "batch"})
    first = client.get("/v1/files?limit=2").get_json()
    after = first["data"][-1]["id"]
    nxt = client.get(f"/v1/files?limit=2&after={after}").get_json()
    assert nxt["data"] and all(f["id"] < after for f in nxt["data"])
    err = assert_error_shape(client.get("/v1/files?after=file-00000000000000"))
    assert err["param"] == "after"
