"""The HTTP API: Flask views that parse, call a use case and respond. No torch here."""

from __future__ import annotations

import logging

from flask import Flask, Response, current_app, g, request

from jobs import limits, service
from jobs.context import Context
from jobs.settings import Settings


def context() -> Context:
    ctx: Context = current_app.extensions["inferq"]
    return ctx


def admit(model: str, tokens: int, *, stream: bool = False,
          member: str | None = None) -> limits.Grant:
    """Decide this request against its project's limits for ``model`` (429 when over);
    the response, whatever it is, carries the decision's ``x-ratelimit-*`` headers."""
    try:
        grant = limits.admit(context(), g.tenant_id, model, tokens, stream=stream,
                             member=member)
    except limits.RateLimited as e:
        g.ratelimit_headers = e.headers
        raise
    g.ratelimit_headers = grant.headers
    return grant


def create_app(settings: Settings | None = None) -> Flask:
    from api import (
        admin,
        batches,
        errors,
        files,
        health,
        inference,
        jobs,
        models,
        openapi,
        usage,
        webhooks,
    )
    from api.schemas import check_path_ids

    settings = settings or Settings.from_env()
    logging.basicConfig(level=settings.log_level)
    app = Flask("inferq")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_upload_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["inferq"] = Context(settings)
    errors.register(app)

    v1 = (files, batches, inference, jobs, models, webhooks)
    authenticated = {mod.bp.name for mod in v1}
    # The Admin API (OpenAI's /v1/organization/...): admin keys only, never project keys.
    organization = (admin, usage)
    administered = {mod.bp.name for mod in organization}

    @app.before_request
    def authenticate() -> None:
        if request.blueprint not in authenticated | administered:
            return
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        if request.blueprint in administered:
            g.admin_key_id = service.authenticate_admin(context(), key)
        else:
            g.tenant_id, g.api_key_id = service.authenticate(context(), key)
        check_path_ids(request.view_args or {})

    @app.after_request
    def ratelimit_headers(resp: Response) -> Response:
        for k, v in g.get("ratelimit_headers", {}).items():
            resp.headers.setdefault(k, v)
        return resp

    for mod in v1:
        app.register_blueprint(mod.bp, url_prefix="/v1")
    for mod in organization:
        app.register_blueprint(mod.bp, url_prefix="/v1/organization")
    app.register_blueprint(health.bp)
    app.register_blueprint(openapi.bp)

    return app
