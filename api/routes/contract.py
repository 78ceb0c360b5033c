"""The blueprint of every route module: Flask's, typed so that a view may say it answers
with a response model of ``jobs.protocol.objects`` (api.app.App sends it as JSON, and
/openapi.json reads the view's return annotation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import flask

F = TypeVar("F", bound=Callable[..., Any])


class Blueprint(flask.Blueprint):
    if TYPE_CHECKING:  # a view may return a response model
        def get(self, rule: str, **options: Any) -> Callable[[F], F]: ...
        def post(self, rule: str, **options: Any) -> Callable[[F], F]: ...
        def delete(self, rule: str, **options: Any) -> Callable[[F], F]: ...
        def route(self, rule: str, **options: Any) -> Callable[[F], F]: ...
