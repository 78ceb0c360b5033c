"""api.routes.openapi.spec on an app with routes the module knows nothing about (as routes
added later are): each gets a valid operation, from what its blueprint and route declare
(api/routes/contract.py), or from its URL rule alone. No backend is reached: building
the description reads the URL map, the contracts and the models only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import flask
import pytest
from flask import Flask
from openapi_spec_validator import validate
from pydantic import BaseModel

from api.routes.contract import Blueprint
from api.routes.openapi import spec, type_of
from jobs.core.settings import Settings


class Shape(BaseModel):
    name: str
    size: int | None


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    from api.app import create_app

    app = create_app(Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none",
                              redis_url="redis://127.0.0.1:1/0", data_dir=tmp_path))
    later = Blueprint("later", __name__, access="project")

    @later.get("/v1/later/<thing_id>/parts/<path:part>")
    def thing(thing_id: str, part: str) -> Any:
        """One part of a thing.

        More about it."""
        return {}

    plain = flask.Blueprint("plain", __name__)  # Flask's own: no access, no contract

    @plain.route("/later/shaped", methods=["GET", "POST"])
    def shaped() -> Shape:
        return Shape(name="x", size=None)

    @later.post("/v1/later/declared", body=Shape, errors={409}, headers=("x-thing",))
    def declared() -> tuple[Shape, int]:
        return Shape(name="x", size=None), 201

    app.register_blueprint(later)
    app.register_blueprint(plain)
    return app


def test_a_route_added_later_gets_a_valid_operation(app: Flask) -> None:
    with app.test_request_context():
        doc = spec()
    validate(doc)
    op = doc["paths"]["/v1/later/{thing_id}/parts/{part}"]["get"]
    assert op["summary"] == "One part of a thing"
    assert [(p["name"], p["in"], p["required"]) for p in op["parameters"]] == [
        ("thing_id", "path", True), ("part", "path", True)]
    assert op["responses"]["default"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    assert op["security"] == [{"bearer": []}]  # its blueprint's access: a project key
    shaped = doc["paths"]["/later/shaped"]
    assert set(shaped) == {"get", "post"}
    assert shaped["get"]["operationId"] != shaped["post"]["operationId"]
    ok = shaped["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/Shape"}  # from the return annotation
    assert set(doc["components"]["schemas"]["Shape"]["required"]) == {"name", "size"}
    assert "security" not in shaped["get"]  # a blueprint of no access: anyone
    declared = doc["paths"]["/v1/later/declared"]["post"]
    assert declared["requestBody"] == {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Shape"}}}}
    answers = declared["responses"]
    assert answers["200"]["content"]["application/json"]["schema"] == {  # (model, status)
        "$ref": "#/components/schemas/Shape"}
    assert set(answers["200"]["headers"]) == {"x-thing"}
    # its own 409, a key's 401, a body's 400 and 413, a backend's 503; no default
    assert set(answers) == {"200", "400", "401", "409", "413", "503"}


def test_known_routes_list_their_errors_and_no_default(app: Flask) -> None:
    with app.test_request_context():
        doc = spec()
    batch = doc["paths"]["/v1/batches/{batch_id}"]["get"]["responses"]
    assert set(batch) == {"200", "401", "404", "503"}
    assert batch["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/BatchObject")
    assert "Idempotency-Key" in {p["name"] for p in
                                 doc["paths"]["/v1/jobs"]["post"]["parameters"]}
    projects = doc["paths"]["/v1/organization/projects"]["get"]
    assert projects["security"] == [{"admin": []}] and "403" in projects["responses"]
    assert "/static/{filename}" not in doc["paths"]  # the app serves no working directory


@pytest.mark.parametrize("schema,text", [
    ({"$ref": "#/components/schemas/FileObject"}, "FileObject"),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "string | null"),
    ({"type": "array", "items": {"type": "integer"}}, "array of integer"),
    ({"const": "list"}, "'list'"), ({"enum": ["1m", "1d"]}, "'1m' | '1d'"),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "object of string"),
    ({}, "any")])
def test_type_of(schema: dict[str, Any], text: str) -> None:
    assert type_of(schema) == text
