"""/v1/organization/usage/* and /v1/organization/costs: the Admin API's usage and costs
(admin keys only; the queries are jobs.tenants.usage's)."""

from __future__ import annotations

from typing import Any

from flask import request

from api.current import context
from api.routes.contract import Blueprint, integer, names, one_of, parameter
from jobs.protocol.objects.admin import CompletionsUsage, CostsResult, EmbeddingsUsage, UsagePage
from jobs.tenants import usage

bp = Blueprint("usage", __name__, access="admin")


def _args() -> dict[str, list[str]]:
    """Query parameters by name, ``name[]`` (the SDK's lists) folded into ``name``."""
    out: dict[str, list[str]] = {}
    for name in request.args:
        out.setdefault(name.removesuffix("[]"), []).extend(request.args.getlist(name))
    return out


def _params(what: str) -> tuple[dict[str, Any], ...]:
    """The query parameters of a usage (``what``: its kind) or costs query."""
    costs = what == "costs"
    most = usage.COST_LIMITS[1] if costs else max(m for _, m in usage.BUCKET_LIMITS.values())
    out = [parameter("start_time", "query", integer(0, usage.MAX_TIME), True, "Unix seconds"),
           parameter("end_time", "query", integer(0, usage.MAX_TIME)),
           parameter("bucket_width", "query",
                     one_of(["1d"] if costs else usage.WIDTHS, default="1d")),
           parameter("limit", "query", integer(1, most)),
           parameter("page", "query", {"type": "string"}, description="next_page of a page"),
           parameter("group_by", "query", names(type="string", enum=list(usage.GROUPS[what]))),
           parameter("project_ids", "query", names()),
           parameter("api_key_ids", "query", names()),
           parameter("line_items" if costs else "models", "query", names())]
    if what == usage.COMPLETIONS:
        out.append(parameter("batch", "query", {"type": "boolean"}))
    return tuple(out)


@bp.get("/usage/completions", params=_params(usage.COMPLETIONS))
def completions() -> UsagePage[CompletionsUsage]:
    return usage.query(context(), usage.COMPLETIONS, _args())


@bp.get("/usage/embeddings", params=_params(usage.EMBEDDINGS_KIND))
def embeddings() -> UsagePage[EmbeddingsUsage]:
    return usage.query(context(), usage.EMBEDDINGS_KIND, _args())


@bp.get("/costs", params=_params("costs"))
def costs() -> UsagePage[CostsResult]:
    return usage.query(context(), "costs", _args())
