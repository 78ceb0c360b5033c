"""The request's handles: the service's Context and the limits decision of a request."""

from __future__ import annotations

from flask import current_app, g

from jobs.core.context import Context
from jobs.tenants import limits


def context() -> Context:
    ctx: Context = current_app.extensions["inferq"]
    return ctx


def charge_limits(model: str, tokens: int, *, stream: bool = False,
          member: str | None = None) -> limits.Grant:
    """Decide this request against its project's limits for ``model`` (429 when over);
    the response, whatever it is, carries the decision's ``x-ratelimit-*`` headers."""
    try:
        grant = limits.charge(context(), g.tenant_id, model, tokens, stream=stream,
                             member=member)
    except limits.RateLimited as e:
        g.ratelimit_headers = e.headers
        raise
    g.ratelimit_headers = grant.headers
    g.metrics_model = model  # validated against the catalog: the request's metrics label
    return grant
