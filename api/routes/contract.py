"""The blueprint of every route module, and the contract each route declares where it is
added: Flask's blueprint, typed so that a view may answer with a response model of
``jobs.protocol.objects`` (api.app.App sends it as JSON), that takes the route's
contract as options of ``bp.get``/``bp.post``/``bp.delete``::

    @bp.post("/batches", body=BatchCreate, errors={403, 404})
    @idempotent
    def create() -> BatchObject: ...

The contract is what /openapi.json says of the route beyond its URL rule and its view's
return annotation: the model its JSON (or multipart) body is parsed with, its query and
header parameters, the error statuses it adds to those every route of its kind has, an
answer that is not JSON (or a JSON answer the annotation cannot name), its streams and
headers. Who may call a route is its blueprint's ``access``, which the app's
authentication reads too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import flask
from pydantic import BaseModel

F = TypeVar("F", bound=Callable[..., Any])
# Who may call the routes of a blueprint: a project key, an admin key (the Admin API),
# a project or an admin key (the dashboard), or anyone.
Access = Literal["project", "admin", "viewer", "public"]

TEXT: dict[str, Any] = {"type": "string"}
BINARY: dict[str, Any] = {"type": "string", "format": "binary"}
# One Server-Sent Event (an event stream's schema describes each of its events).
SSE: dict[str, Any] = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"},
    "data": {"type": "string", "description": "a JSON object (a stream of completion "
             "chunks ends with the data [DONE])"}}}


@dataclasses.dataclass(frozen=True)
class Contract:
    body: type[BaseModel] | None = None  # the JSON body's model
    optional_body: bool = False  # the body may be left out (every field optional)
    upload: type[BaseModel] | None = None  # a multipart form's model
    params: tuple[dict[str, Any], ...] = ()  # query and header parameters
    errors: frozenset[int] = frozenset()  # beyond those its kind, path and body imply
    ok: type[BaseModel] | None = None  # the 200 JSON answer, where the view returns a Response
    media: Mapping[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # not JSON
    stream: bool = False  # ``stream: true`` answers with Server-Sent Events
    headers: tuple[str, ...] = ()  # the 200 answer's own headers
    # Other statuses it answers with, and what they mean: with its JSON answer's model,
    # or (an answer that is not JSON) with no content.
    answers: Mapping[int, str] = dataclasses.field(default_factory=dict)
    backend: bool = True  # asks the database or Redis, so it may answer 503
    security: tuple[str, ...] | None = None  # other keys than its blueprint's access

    @classmethod
    def of(cls, options: dict[str, Any]) -> Contract:
        """Takes the contract's options out of a route's options (the rest are Werkzeug's)."""
        mine = {f.name: options.pop(f.name) for f in dataclasses.fields(cls)
                if f.name in options}
        for name in ("params", "headers", "security"):
            if mine.get(name) is not None:
                mine[name] = tuple(mine[name])
        if "errors" in mine:
            mine["errors"] = frozenset(mine["errors"])
        return cls(**mine)


def contract(view: Any) -> Contract | None:
    """The contract of a view added by a route of this module's blueprint."""
    return getattr(view, "__contract__", None)


class Blueprint(flask.Blueprint):
    def __init__(self, name: str, import_name: str, *, access: Access = "public",
                 **kwargs: Any) -> None:
        super().__init__(name, import_name, **kwargs)
        self.access = access

    def add_url_rule(self, rule: str, endpoint: str | None = None,
                     view_func: Callable[..., Any] | None = None,
                     provide_automatic_options: bool | None = None, **options: Any) -> None:
        doc = Contract.of(options)
        if view_func is not None:
            view_func.__contract__ = doc  # type: ignore[attr-defined]
        super().add_url_rule(rule, endpoint, view_func, provide_automatic_options, **options)

    if TYPE_CHECKING:  # a view may return a response model
        def get(self, rule: str, **options: Any) -> Callable[[F], F]: ...
        def post(self, rule: str, **options: Any) -> Callable[[F], F]: ...
        def delete(self, rule: str, **options: Any) -> Callable[[F], F]: ...
        def route(self, rule: str, **options: Any) -> Callable[[F], F]: ...


def parameter(name: str, where: str, schema: dict[str, Any], required: bool = False,
              description: str | None = None) -> dict[str, Any]:
    out = {"name": name, "in": where, "required": required, "schema": schema}
    if description:
        out["description"] = description
    return out


def integer(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def names(**items: Any) -> dict[str, Any]:
    """A list of strings (or of ``items``)."""
    return {"type": "array", "items": items or {"type": "string"}}


def one_of(values: Iterable[str], **extra: Any) -> dict[str, Any]:
    return {"type": "string", "enum": list(values), **extra}


PAGE = (parameter("limit", "query", {**integer(1, 100), "default": 20}),
        parameter("after", "query", {"type": "string", "maxLength": 64},
                  description="the last id of the previous page"))
