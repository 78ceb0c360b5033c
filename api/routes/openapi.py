"""/openapi.json and /docs: an OpenAPI 3.1 description of every route the app serves,
built from its URL map, the pydantic models that validate request bodies and the ones
that describe responses (api/schemas.py), so it cannot drift from any of them; /docs
is the same description as an HTML page.

A route this module knows nothing about (one added later) still gets a valid
operation: its path parameters, a success answer and the error shape as ``default``.
A view whose return annotation is a pydantic model gets that model as its 200 schema.
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, render_template
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from werkzeug.routing import Rule

from api import schemas as s
from api.routes import admin, fleet
from jobs.asyncjobs.lifecycle import JobCreate
from jobs.batches import partial
from jobs.batches.retry import BatchRetry
from jobs.batches.uploads import UploadComplete, UploadCreate
from jobs.core.dispatch import MODEL_LANES
from jobs.protocol.requests import (
    BatchCreate,
    ChatBody,
    CompletionBody,
    EmbeddingsBody,
    ResponsesBody,
)
from jobs.tenants import projects as tenants
from jobs.tenants import usage
from jobs.webhooks.events import EndpointCreate, EndpointUpdate, RotateSecret, TestSend

bp = Blueprint("openapi", __name__,
               template_folder=str(Path(__file__).resolve().parent.parent / "templates"))

# The view (endpoint name) -> the model its JSON body is parsed with.
BODIES: dict[str, type[BaseModel]] = {
    "batches.create": BatchCreate, "batches.retry_": BatchRetry, "uploads.create": UploadCreate,
    "uploads.complete": UploadComplete, "inference.embeddings": EmbeddingsBody,
    "inference.chat_completions": ChatBody, "inference.completions": CompletionBody,
    "inference.responses": ResponsesBody,
    "jobs.create": JobCreate, "webhooks.create": EndpointCreate,
    "webhooks.update": EndpointUpdate, "webhooks.rotate_secret": RotateSecret,
    "webhooks.test": TestSend, "webhooks.rotate_callback_secret": RotateSecret,
    "admin.create_project": admin.ProjectCreate, "admin.update_project": admin.ProjectUpdate,
    "admin.create_service_account": admin.ServiceAccountCreate,
    "admin.create_key": admin.KeyCreate, "admin.update_rate_limit": admin.RateLimitUpdate,
    "admin.create_location": admin.LocationCreate,
    "fleet.step": fleet.RolloutStep, "fleet.pool": fleet.PoolBody, "fleet.add": fleet.ModelAdd}
# Bodies that may be left out entirely (every field optional).
OPTIONAL_BODIES = {"batches.retry_", "webhooks.update", "webhooks.rotate_secret",
                   "webhooks.rotate_callback_secret",
                   "admin.update_project", "admin.create_key"}
UPLOADS: dict[str, type[BaseModel]] = {"files.create": s.FileUpload,
                                       "uploads.add_part": s.PartUpload}

# The view -> the model of its 200 JSON answer.
OK: dict[str, type[BaseModel]] = {
    "files.create": s.FileObject, "files.list_": s.Page[s.FileObject],
    "files.retrieve": s.FileObject, "files.delete": s.Deleted,
    "uploads.create": s.UploadObject, "uploads.add_part": s.UploadPartObject,
    "uploads.complete": s.UploadObject, "uploads.cancel": s.UploadObject,
    "batches.create": s.BatchObject, "batches.list_": s.Page[s.BatchObject],
    "batches.retrieve": s.BatchObject, "batches.cancel": s.BatchObject,
    "batches.retry_": s.BatchObject,
    "inference.embeddings": s.EmbeddingsResponse,
    "inference.chat_completions": s.ChatCompletion, "inference.completions": s.Completion,
    "inference.responses": s.ResponseObject,
    "jobs.create": s.JobObject, "jobs.retrieve": s.JobObject,
    "models.list_": s.ModelList, "models.retrieve": s.ModelObject,
    "webhooks.create": s.WebhookEndpointWithSecret,
    "webhooks.list_": s.Page[s.WebhookEndpoint], "webhooks.retrieve": s.WebhookEndpoint,
    "webhooks.update": s.WebhookEndpoint, "webhooks.delete": s.Deleted,
    "webhooks.rotate_secret": s.WebhookEndpointWithSecret,
    "webhooks.test": s.WebhookTestResult, "webhooks.event_types": s.EventTypeList,
    "webhooks.deliveries": s.Page[s.Delivery], "webhooks.resend": s.Delivery,
    "webhooks.callback_secret": s.CallbackSecret,
    "webhooks.rotate_callback_secret": s.CallbackSecretWithSecret,
    "health.healthz": s.Liveness, "health.readyz": s.Health,
    "admin.create_project": s.Project, "admin.list_projects": s.Page[s.Project],
    "admin.retrieve_project": s.Project, "admin.update_project": s.Project,
    "admin.archive_project": s.Project,
    "admin.create_service_account": s.ServiceAccountCreated,
    "admin.list_service_accounts": s.Page[s.ServiceAccount],
    "admin.retrieve_service_account": s.ServiceAccount,
    "admin.delete_service_account": s.Deleted, "admin.create_key": s.NewKey,
    "admin.list_keys": s.Page[s.ApiKey], "admin.retrieve_key": s.ApiKey,
    "admin.delete_key": s.Deleted, "admin.list_rate_limits": s.Page[s.RateLimit],
    "admin.update_rate_limit": s.RateLimit,
    "admin.create_location": s.DataLocation, "admin.list_locations": s.Page[s.DataLocation],
    "admin.delete_location": s.Deleted,
    "usage.completions": s.UsagePage[s.CompletionsUsage],
    "usage.embeddings": s.UsagePage[s.EmbeddingsUsage],
    "usage.costs": s.UsagePage[s.CostsResult],
    "fleet.list_": s.RolloutList, "fleet.get": s.Rollout, "fleet.step": s.Rollout,
    "fleet.pool": s.Rollout, "fleet.add": s.Rollout, "fleet.remove": s.Deleted}
TEXT = {"type": "string"}
# One Server-Sent Event (an event stream's schema describes each of its events).
SSE = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"},
    "data": {"type": "string", "description": "a JSON object (a stream of completion "
             "chunks ends with the data [DONE])"}}}
# The view -> its 200 answer that is not JSON (media type -> schema).
MEDIA: dict[str, dict[str, Any]] = {
    "files.content": {"application/jsonl": TEXT, "application/octet-stream": {
        "type": "string", "format": "binary"}},
    "batches.output": {"application/jsonl": TEXT},
    "batches.merged_output": {"application/jsonl": TEXT, "application/octet-stream": {
        "type": "string", "format": "binary"}},
    "batches.events": {"text/event-stream": SSE},
    "health.metrics": {"text/plain": TEXT},
    "openapi.openapi": {"application/json": {"type": "object"}},
    "openapi.docs": {"text/html": TEXT}}
STREAMS = {"inference.chat_completions", "inference.completions",  # stream: true → SSE
           "inference.responses"}
HEADERS = {  # the 200 answer's headers
    "batches.output": ("inferq-next-cursor", "inferq-batch-status", "inferq-chunks",
                       "inferq-complete"),
    "inference.embeddings": ("inferq-model-version", "inferq-queue-ms"),
    **{v: ("inferq-model-version",) for v in ("inference.chat_completions",
                                              "inference.completions",
                                              "inference.responses")}}

AUTHENTICATED = {"batches", "files", "inference", "jobs", "models", "uploads", "webhooks"}
ADMINISTERED = {"admin", "usage", "fleet"}
NO_BACKEND = {"openapi.openapi", "openapi.docs", "health.healthz"}  # the rest may answer 503
# Error statuses a view has beyond those its parameters imply (see _errors).
ERRORS: dict[str, set[int]] = {
    "batches.create": {403, 404}, "batches.cancel": {409}, "uploads.cancel": {400},
    "batches.retry_": {409}, "batches.merged_output": {409},
    "files.delete": {409},
    "inference.embeddings": {413, 429, 504}, "inference.chat_completions": {413, 429, 504},
    "inference.completions": {413, 429, 504}, "inference.responses": {413, 429, 504},
    "jobs.create": {429},
    "webhooks.callback_secret": {404}, "health.metrics": {401, 403},
    "admin.create_project": {409}, "admin.update_project": {409},
    "admin.archive_project": {409}, "admin.create_service_account": {409},
    "admin.create_key": {409}, "admin.update_rate_limit": {409},
    "admin.create_location": {409},
    "fleet.add": {409}, "fleet.remove": {409}}
IDEMPOTENT = {"batches.create", "batches.retry_", "files.create", "jobs.create", "uploads.create",
              "uploads.add_part"}
STATUS_TEXT = {200: "success", 204: "no content", 400: "invalid request",
               401: "no valid API key", 403: "the key may not do this",
               404: "no such object", 409: "conflicts with the object's state",
               413: "the request is too large", 429: "rate limited (see retry-after)",
               503: "unavailable now; retry after retry-after seconds",
               504: "no answer in time"}
REF = "#/components/schemas/{model}"
_ARG = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def _param(name: str, where: str, schema: dict[str, Any], required: bool = False,
           description: str | None = None) -> dict[str, Any]:
    out = {"name": name, "in": where, "required": required, "schema": schema}
    if description:
        out["description"] = description
    return out


def _int(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _names(**items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items or {"type": "string"}}


PAGE = [_param("limit", "query", {**_int(1, 100), "default": 20}),
        _param("after", "query", {"type": "string", "maxLength": 64},
               description="the last id of the previous page")]


def _usage_params(what: str) -> list[dict[str, Any]]:
    widths = ["1d"] if what == "costs" else list(usage.WIDTHS)
    out = [_param("start_time", "query", _int(0, usage.MAX_TIME), True, "Unix seconds"),
           _param("end_time", "query", _int(0, usage.MAX_TIME)),
           _param("bucket_width", "query", {"type": "string", "enum": widths, "default": "1d"}),
           _param("limit", "query", _int(1, usage.COST_LIMITS[1] if what == "costs"
                                            else max(m for _, m in usage.BUCKET_LIMITS.values()))),
           _param("page", "query", {"type": "string"}, description="next_page of a page"),
           _param("group_by", "query", _names(type="string", enum=list(usage.GROUPS[what]))),
           _param("project_ids", "query", _names()), _param("api_key_ids", "query", _names())]
    if what == "costs":
        out.append(_param("line_items", "query", _names()))
    else:
        out.append(_param("models", "query", _names()))
    if what == usage.COMPLETIONS:
        out.append(_param("batch", "query", {"type": "boolean"}))
    return out


# The view -> its query and header parameters.
PARAMS: dict[str, list[dict[str, Any]]] = {
    "files.list_": [*PAGE, _param("purpose", "query", {"type": "string", "maxLength": 64})],
    "health.readyz": [_param("lane", "query", _names(type="string", enum=list(MODEL_LANES)),
                             description="lanes that must have a live worker")],
    "batches.list_": PAGE, "webhooks.list_": PAGE, "webhooks.deliveries": PAGE,
    "admin.list_service_accounts": PAGE,
    "admin.list_projects": [*PAGE, _param("include_archived", "query", {"type": "boolean"})],
    "admin.list_keys": [*PAGE, _param("owner_project_access", "query", {
        "type": "string", "enum": list(tenants.OWNER_ACCESS), "default": "any"})],
    "admin.list_rate_limits": [*PAGE, _param("before", "query", {"type": "string"})],
    "batches.output": [
        _param("partial", "query", {"type": "string", "enum": ["true"]}, True,
               "the lines committed so far (the final output is output_file_id's)"),
        _param("after", "query", {"type": "string"},
               description="the inferq-next-cursor header of the previous answer"),
        _param("kind", "query", {"type": "string", "enum": list(partial.KINDS),
                                 "default": "output"})],
    "batches.events": [_param("Last-Event-ID", "header", {"type": "string"},
                              description="the id of the last event seen: resume after it")],
    "usage.completions": _usage_params(usage.COMPLETIONS),
    "usage.embeddings": _usage_params(usage.EMBEDDINGS_KIND),
    "usage.costs": _usage_params("costs")}
IDEMPOTENCY_KEY = _param("Idempotency-Key", "header",
                         {"type": "string", "minLength": 1, "maxLength": 255},
                         description="a retry with the same key replays the first answer")


def _json(model: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=model)}}}


def _name(model: type[BaseModel]) -> str:
    """The model's name in components (pydantic's, generics included: Page_FileObject_)."""
    return re.sub(r"[^a-zA-Z0-9.\-_]", "_", model.__name__)


def _annotated(view: Any) -> type[BaseModel] | None:
    try:
        ret = typing.get_type_hints(view).get("return")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve says nothing
        return None
    return ret if inspect.isclass(ret) and issubclass(ret, BaseModel) else None


def _summary(endpoint: str, view: Any) -> tuple[str, str | None]:
    doc = inspect.getdoc(view) if view is not None else None
    if doc:
        first = doc.split("\n\n", 1)[0].replace("\n", " ")
        return first.split(". ", 1)[0].rstrip("."), doc
    bp_name, _, name = endpoint.rpartition(".")
    words = name.strip("_").replace("_", " ")
    return (f"{bp_name}: {words}" if bp_name else words), None


def _errors(endpoint: str, rule: Rule, params: list[dict[str, Any]]) -> set[int]:
    """The error statuses the view can answer with: its own, those of the checks every
    view of its blueprint passes (keys), its path ids, parameters and body."""
    codes = set(ERRORS.get(endpoint, ()))
    bp_name = endpoint.split(".")[0]
    if bp_name in AUTHENTICATED:
        codes.add(401)
    if bp_name in ADMINISTERED:
        codes |= {401, 403}
    if rule.arguments:
        codes.add(404)
    if any(p["in"] != "path" for p in params) or endpoint in BODIES or endpoint in UPLOADS:
        codes.add(400)  # a bad path id is a 404
    if endpoint in BODIES or endpoint in UPLOADS:
        codes.add(413)
    if endpoint in IDEMPOTENT:
        codes.add(409)
    if endpoint not in NO_BACKEND:
        codes.add(503)
    return codes


def _responses(endpoint: str, rule: Rule, view: Any,
               params: list[dict[str, Any]]) -> tuple[dict[str, Any], set[type[BaseModel]]]:
    used: set[type[BaseModel]] = set()
    ok: dict[str, Any] = {"description": STATUS_TEXT[200]}
    model = OK.get(endpoint) or _annotated(view)
    if model is not None:
        used.add(model)
        ok["content"] = _json(_name(model))
        if endpoint in STREAMS:
            ok["content"]["text/event-stream"] = {"schema": SSE}
            ok["description"] = "the answer; with stream: true, its chunks as Server-Sent Events"
    elif endpoint in MEDIA:
        ok["content"] = {t: {"schema": sch} for t, sch in MEDIA[endpoint].items()}
    elif endpoint == "static" or endpoint.endswith(".static"):
        ok["content"] = {"*/*": {"schema": {"type": "string", "format": "binary"}}}
    if endpoint in HEADERS:
        ok["headers"] = {h: {"schema": TEXT} for h in HEADERS[endpoint]}
    out: dict[str, Any] = {"200": ok}
    if endpoint == "batches.events":
        out["204"] = {"description": "the batch has ended and the client saw its last event"}
    if endpoint not in OK and endpoint not in MEDIA:  # not described here: any error status
        out["default"] = {"description": "an error", "content": _json("Error")}
        return out, used
    for code in sorted(_errors(endpoint, rule, params)):
        resp: dict[str, Any] = {"description": STATUS_TEXT[code], "content": _json("Error")}
        if code in (429, 503):
            resp["headers"] = {"retry-after": {"schema": {"type": "string"},
                                               "description": "seconds to wait"}}
        if code == 503 and endpoint == "health.readyz":
            resp = {"description": "not ready: a backend, or a worker of a lane asked for, "
                                   "is missing",
                    "content": _json("Health")}
        out[str(code)] = resp
    return out, used


def _operation(rule: Rule, method: str) -> tuple[dict[str, Any], set[type[BaseModel]]]:
    endpoint = rule.endpoint
    view = current_app.view_functions.get(endpoint)
    summary, description = _summary(endpoint, view)
    op: dict[str, Any] = {"operationId": endpoint, "summary": summary,
                          "tags": [endpoint.split(".")[0]]}
    if description:
        op["description"] = description
    params = [_param(a, "path", {"type": "string", "minLength": 1}, True)
              for a in _ARG.findall(rule.rule)]  # in the path's order
    params += PARAMS.get(endpoint, [])
    if endpoint in IDEMPOTENT:
        params.append(IDEMPOTENCY_KEY)
    if params:
        op["parameters"] = params
    used: set[type[BaseModel]] = set()
    if endpoint in BODIES:
        body = BODIES[endpoint]
        used.add(body)
        op["requestBody"] = {"required": endpoint not in OPTIONAL_BODIES,
                             "content": _json(_name(body))}
    elif endpoint in UPLOADS:
        used.add(UPLOADS[endpoint])
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {
            "schema": {"$ref": REF.format(model=_name(UPLOADS[endpoint]))}}}}
    op["responses"], models = _responses(endpoint, rule, view, params)
    used |= models
    bp_name = endpoint.split(".")[0]
    if bp_name in ADMINISTERED:
        op["security"] = [{"admin": []}]
    elif endpoint == "health.metrics":
        op["security"] = [{"metrics": []}, {"admin": []}]
    elif bp_name in AUTHENTICATED or (bp_name not in ("health", "openapi", "static")
                                      and rule.rule.startswith("/v1/")):
        op["security"] = [{"bearer": []}]
    return op, used


def spec() -> dict[str, Any]:
    """The description of this app's routes (``current_app``): every rule of its URL
    map, each method but HEAD and OPTIONS."""
    paths: dict[str, dict[str, Any]] = {}
    models: set[type[BaseModel]] = {s.Error}
    seen: dict[str, int] = {}
    for rule in current_app.url_map.iter_rules():
        path = _ARG.sub(r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            op, used = _operation(rule, method.lower())
            n = seen[rule.endpoint] = seen.get(rule.endpoint, 0) + 1
            if n > 1:  # one view on more rules or methods: operation ids are unique
                op["operationId"] = f"{rule.endpoint}.{method.lower()}{n}"
            paths.setdefault(path, {})[method.lower()] = op
            models |= used
    _, defs = models_json_schema([(m, "validation") for m in sorted(models, key=_name)],
                                 ref_template=REF)
    return {"openapi": "3.1.0",
            "info": {"title": "inferq", "version": "1", "description":
                     "Batch, job and realtime inference with the OpenAI API's shapes. "
                     "Errors are always {\"error\": {message, type, param, code}}."},
            "paths": dict(sorted(paths.items())),
            "components": {"schemas": dict(sorted(defs.get("$defs", {}).items())),
                           "securitySchemes": {
                               "bearer": {"type": "http", "scheme": "bearer",
                                          "description": "a project API key"},
                               "admin": {"type": "http", "scheme": "bearer",
                                         "description": "an admin key (the Admin API)"},
                               "metrics": {"type": "http", "scheme": "bearer",
                                           "description": "the metrics token "
                                           "(INFERQ_METRICS_TOKEN) of GET /metrics"}}}}


@bp.get("/openapi.json")
def openapi() -> Any:
    """This description, as OpenAPI 3.1 JSON."""
    return spec()


@bp.get("/docs")
def docs() -> Any:
    """This description as an HTML page: every operation, its parameters, body and
    answers."""
    doc = spec()
    ops = [(path, method, op) for path, item in doc["paths"].items()
           for method, op in item.items()]
    return render_template("docs.html", doc=doc, ops=ops, type_of=type_of)


def type_of(schema: dict[str, Any] | None) -> str:
    """A JSON schema, shortly: ``FileObject``, ``string | null``, ``array of integer``."""
    if not schema:
        return "any"
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return " | ".join(repr(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(type_of(x) for x in schema[key])
    t = schema.get("type", "object")
    if t == "array":
        return f"array of {type_of(schema.get('items'))}"
    if t == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    return " | ".join(t) if isinstance(t, list) else str(t)
