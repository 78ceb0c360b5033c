"""/openapi.json and /docs: an OpenAPI 3.1 description of every route the app serves,
built from its URL map, each route's contract (api/routes/contract.py: its body,
parameters, errors, media and who may call it), the pydantic models that validate
request bodies and the response models its views return (jobs/protocol/objects/), so
it cannot drift from any of them; /docs is the same description as an HTML page.

A view whose return annotation is a response model (or a ``(model, status)`` tuple) gets
that model as its 200 schema. A route that says nothing of its answer (neither a model
nor media) still gets a valid operation: its path parameters, a success answer and the
error shape as ``default``.
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

from api.routes.contract import SSE, TEXT, Blueprint, Contract, contract, parameter
from jobs.protocol.objects.common import Error

IDEMPOTENCY_KEY = parameter("Idempotency-Key", "header",
                            {"type": "string", "minLength": 1, "maxLength": 255},
                            description="a retry with the same key replays the first answer")
SECURITY = {"project": ("bearer",), "viewer": ("bearer",), "admin": ("admin",), "public": ()}

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
    if typing.get_origin(ret) is tuple:  # (model, status[, headers])
        ret = typing.get_args(ret)[0]
    return ret if inspect.isclass(ret) and issubclass(ret, BaseModel) else None


def _summary(endpoint: str, view: Any) -> tuple[str, str | None]:
    doc = inspect.getdoc(view) if view is not None else None
    if doc:
        first = doc.split("\n\n", 1)[0].replace("\n", " ")
        return first.split(". ", 1)[0].rstrip("."), doc
    bp_name, _, name = endpoint.rpartition(".")
    words = name.strip("_").replace("_", " ")
    return (f"{bp_name}: {words}" if bp_name else words), None


def _errors(access: str, doc: Contract, rule: Rule, params: list[dict[str, Any]]) -> set[int]:
    """The error statuses the view can answer with: its own, those of the checks every
    view of its blueprint passes (keys), its path ids, parameters and body."""
    codes = set(doc.errors)
    if access in ("project", "viewer"):
        codes.add(401)
    if access == "admin":
        codes |= {401, 403}
    if rule.arguments:
        codes.add(404)
    bodied = doc.body is not None or doc.upload is not None
    if bodied or any(p["in"] != "path" for p in params):
        codes.add(400)  # a bad path id is a 404
    if bodied:
        codes.add(413)
    if _idempotent(rule):
        codes.add(409)
    if doc.backend:
        codes.add(503)
    return codes


def _responses(access: str, doc: Contract, rule: Rule, view: Any,
               params: list[dict[str, Any]]) -> tuple[dict[str, Any], set[type[BaseModel]]]:
    used: set[type[BaseModel]] = set()
    ok: dict[str, Any] = {"description": STATUS_TEXT[200]}
    model = doc.ok or _annotated(view)
    if model is not None:
        used.add(model)
        ok["content"] = _json(_name(model))
        if doc.stream:
            ok["content"]["text/event-stream"] = {"schema": SSE}
            ok["description"] = "the answer; with stream: true, its chunks as Server-Sent Events"
    elif doc.media:
        ok["content"] = {t: {"schema": sch} for t, sch in doc.media.items()}
    elif rule.endpoint == "static" or rule.endpoint.endswith(".static"):
        ok["content"] = {"*/*": {"schema": {"type": "string", "format": "binary"}}}
    if doc.headers:
        ok["headers"] = {h: {"schema": TEXT} for h in doc.headers}
    out: dict[str, Any] = {"200": ok}
    if model is None and not doc.media:  # the answer is not described: any error status
        out["default"] = {"description": "an error", "content": _json("Error")}
        return out, used
    for code in sorted(_errors(access, doc, rule, params)):
        resp: dict[str, Any] = {"description": STATUS_TEXT[code], "content": _json("Error")}
        if code in (429, 503):
            resp["headers"] = {"retry-after": {"schema": {"type": "string"},
                                               "description": "seconds to wait"}}
        out[str(code)] = resp
    for code, what in doc.answers.items():  # other answers: with the model, or empty
        out[str(code)] = ({"description": what, "content": _json(_name(model))}
                          if model is not None else {"description": what})
    return out, used


def _idempotent(rule: Rule) -> bool:
    return bool(getattr(current_app.view_functions.get(rule.endpoint), "idempotent", False))


def _operation(rule: Rule, method: str) -> tuple[dict[str, Any], set[type[BaseModel]]]:
    endpoint = rule.endpoint
    view = current_app.view_functions.get(endpoint)
    doc = contract(view) or Contract()
    blueprint = current_app.blueprints.get(endpoint.rpartition(".")[0])
    access = getattr(blueprint, "access", "public")
    summary, description = _summary(endpoint, view)
    op: dict[str, Any] = {"operationId": endpoint, "summary": summary,
                          "tags": [endpoint.split(".")[0]]}
    if description:
        op["description"] = description
    params = [parameter(a, "path", {"type": "string", "minLength": 1}, True)
              for a in _ARG.findall(rule.rule)]  # in the path's order
    params += doc.params
    if _idempotent(rule):
        params.append(IDEMPOTENCY_KEY)
    if params:
        op["parameters"] = params
    used: set[type[BaseModel]] = set()
    if doc.body is not None:
        used.add(doc.body)
        op["requestBody"] = {"required": not doc.optional_body,
                             "content": _json(_name(doc.body))}
    elif doc.upload is not None:
        used.add(doc.upload)
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {
            "schema": {"$ref": REF.format(model=_name(doc.upload))}}}}
    op["responses"], models = _responses(access, doc, rule, view, params)
    used |= models
    security = doc.security if doc.security is not None else SECURITY[access]
    if security:
        op["security"] = [{name: []} for name in security]
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


@bp.get("/openapi.json", backend=False, media={"application/json": {"type": "object"}})
def openapi() -> Any:
    """This description, as OpenAPI 3.1 JSON."""
    return spec()


@bp.get("/docs", backend=False, media={"text/html": TEXT})
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
