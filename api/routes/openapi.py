"""/openapi.json and /docs: an OpenAPI 3.1 description of every route the app serves,
built from its URL map, the pydantic models that validate request bodies and the ones
that describe responses (api/schemas/), so it cannot drift from any of them; /docs
is the same description as an HTML page. What the URL map cannot tell of a view
is api/routes/openapi_views.py.

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

from flask import current_app, render_template
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from werkzeug.routing import Rule

from api.routes.contract import Blueprint
from api.routes.openapi_views import (
    ADMINISTERED,
    AUTHENTICATED,
    BODIES,
    ERRORS,
    HEADERS,
    IDEMPOTENCY_KEY,
    IDEMPOTENT,
    MEDIA,
    NO_BACKEND,
    OK,
    OPTIONAL_BODIES,
    PARAMS,
    SSE,
    STREAMS,
    TEXT,
    UPLOADS,
    parameter,
)
from jobs.protocol.objects.common import Error

bp = Blueprint("openapi", __name__,
               template_folder=str(Path(__file__).resolve().parent.parent / "templates"))

STATUS_TEXT = {200: "success", 204: "no content", 400: "invalid request",
               401: "no valid API key", 403: "the key may not do this",
               404: "no such object", 409: "conflicts with the object's state",
               413: "the request is too large", 429: "rate limited (see retry-after)",
               503: "unavailable now; retry after retry-after seconds",
               504: "no answer in time"}
REF = "#/components/schemas/{model}"
_ARG = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


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
    params = [parameter(a, "path", {"type": "string", "minLength": 1}, True)
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
    models: set[type[BaseModel]] = {Error}
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
