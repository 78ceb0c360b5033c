"""/v1/organization/usage/* and /v1/organization/costs: the Admin API's usage and costs
(admin keys only; the queries are jobs.tenants.usage's)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, request

from api.current import context
from jobs.tenants import usage

bp = Blueprint("usage", __name__)


def _args() -> dict[str, list[str]]:
    """Query parameters by name, ``name[]`` (the SDK's lists) folded into ``name``."""
    out: dict[str, list[str]] = {}
    for name in request.args:
        out.setdefault(name.removesuffix("[]"), []).extend(request.args.getlist(name))
    return out


def _page(what: str) -> Any:
    return usage.query(context(), what, _args())


@bp.get("/usage/completions")
def completions() -> Any:
    return _page(usage.COMPLETIONS)


@bp.get("/usage/embeddings")
def embeddings() -> Any:
    return _page(usage.EMBEDDINGS_KIND)


@bp.get("/costs")
def costs() -> Any:
    return _page("costs")
