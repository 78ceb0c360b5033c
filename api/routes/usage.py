"""/v1/organization/usage/* and /v1/organization/costs: the Admin API's usage and costs
(admin keys only; the queries are jobs.tenants.usage's)."""

from __future__ import annotations

from flask import request

from api.current import context
from api.routes.contract import Blueprint
from jobs.protocol.objects.admin import CompletionsUsage, CostsResult, EmbeddingsUsage, UsagePage
from jobs.tenants import usage

bp = Blueprint("usage", __name__)


def _args() -> dict[str, list[str]]:
    """Query parameters by name, ``name[]`` (the SDK's lists) folded into ``name``."""
    out: dict[str, list[str]] = {}
    for name in request.args:
        out.setdefault(name.removesuffix("[]"), []).extend(request.args.getlist(name))
    return out


@bp.get("/usage/completions")
def completions() -> UsagePage[CompletionsUsage]:
    return usage.query(context(), usage.COMPLETIONS, _args())


@bp.get("/usage/embeddings")
def embeddings() -> UsagePage[EmbeddingsUsage]:
    return usage.query(context(), usage.EMBEDDINGS_KIND, _args())


@bp.get("/costs")
def costs() -> UsagePage[CostsResult]:
    return usage.query(context(), "costs", _args())
