"""api.routes.openapi.spec on an app with routes the module knows nothing about (as routes
added later are): each still gets a valid operation. No backend is reached: building
the description reads the URL map and the models only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flask import Blueprint, Flask
from openapi_spec_validator import validate
from pydantic import BaseModel

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
    later = Blueprint("later", __name__)

    @later.get("/v1/later/<thing_id>/parts/<path:part>")
    def thing(thing_id: str, part: str) -> Any:
        """One part of a thing.

        More about it."""
        return {}

    @later.route("/later/shaped", methods=["GET", "POST"])
    def shaped() -> Shape:
        return Shape(name="x", size=None)

    app.register_blueprint(later)
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
    assert op["security"] == [{"bearer": []}]  # under /v1/: a key is expected
    shaped = doc["paths"]["/later/shaped"]
    assert set(shaped) == {"get", "post"}
    assert shaped["get"]["operationId"] != shaped["post"]["operationId"]
    ok = shaped["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/Shape"}  # from the return annotation
    assert set(doc["components"]["schemas"]["Shape"]["required"]) == {"name", "size"}
    assert "security" not in shaped["get"]


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
