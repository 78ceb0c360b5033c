"""/openapi.json: an OpenAPI 3.1 description built from the routes the app serves
and the pydantic models that validate their request bodies, so it cannot drift
from either."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, current_app
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from jobs.asyncjobs import JobCreate
from jobs.requests import BatchCreate, ChatBody, CompletionBody, EmbeddingsBody
from jobs.webhooks import EndpointCreate, EndpointUpdate, RotateSecret, TestSend

bp = Blueprint("openapi", __name__)

# The view (endpoint name) -> the model its JSON body is parsed with.
BODIES: dict[str, type[BaseModel]] = {
    "batches.create": BatchCreate, "inference.embeddings": EmbeddingsBody,
    "inference.chat_completions": ChatBody, "inference.completions": CompletionBody,
    "jobs.create": JobCreate, "webhooks.create": EndpointCreate,
    "webhooks.update": EndpointUpdate, "webhooks.rotate_secret": RotateSecret,
    "webhooks.test": TestSend, "webhooks.rotate_callback_secret": RotateSecret}
LISTS = {"batches.list_", "files.list_", "webhooks.list_", "webhooks.deliveries"}
IDEMPOTENT = {"batches.create", "files.create", "jobs.create"}
REF = "#/components/schemas/{model}"
_ARG = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]},
                   "code": {"type": ["string", "null"]}}}}}
UPLOAD = {"type": "object", "required": ["file", "purpose"], "properties": {
    "file": {"type": "string", "format": "binary"},
    "purpose": {"type": "string", "enum": ["batch"]}}}


def _param(name: str, where: str, schema: dict[str, Any], required: bool) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": schema}


def _operation(endpoint: str, args: list[str]) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": endpoint, "responses": {
        "200": {"description": "success"},
        "default": {"description": "an error", "content": {"application/json": {
            "schema": {"$ref": REF.format(model="Error")}}}}}}
    params = [_param(a, "path", {"type": "string"}, True) for a in args]
    if endpoint in LISTS:
        params += [_param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100,
                                              "default": 20}, False),
                   _param("after", "query", {"type": "string"}, False)]
    if endpoint == "files.list_":
        params.append(_param("purpose", "query", {"type": "string"}, False))
    if endpoint in IDEMPOTENT:
        params.append(_param("Idempotency-Key", "header",
                             {"type": "string", "minLength": 1, "maxLength": 255}, False))
    if params:
        op["parameters"] = params
    if endpoint in BODIES:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": REF.format(model=BODIES[endpoint].__name__)}}}}
    elif endpoint == "files.create":
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {
            "schema": {"$ref": REF.format(model="FileUpload")}}}}
    if endpoint.split(".")[0] in ("batches", "files", "inference", "jobs", "models",
                                  "webhooks"):
        op["security"] = [{"bearer": []}]
    return op


def spec() -> dict[str, Any]:
    """The description of this app's routes (``current_app``)."""
    _, defs = models_json_schema([(m, "validation") for m in BODIES.values()],
                                 ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for rule in current_app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = _ARG.sub(r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(rule.endpoint,
                                                                    list(rule.arguments))
    schemas = {**defs.get("$defs", {}), "Error": ERROR, "FileUpload": UPLOAD}
    return {"openapi": "3.1.0", "info": {"title": "inferq", "version": "1"},
            "paths": dict(sorted(paths.items())),
            "components": {"schemas": schemas, "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"}}}}


@bp.get("/openapi.json")
def openapi() -> Any:
    return spec()
