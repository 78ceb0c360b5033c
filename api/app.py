"""The Flask app: blueprints, authentication, traces and limits around every request."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, g, request
from opentelemetry.trace import SpanKind
from pydantic import BaseModel

from api import errors, metrics
from api.current import context
from api.request_parsing import MAX_JSON_BODY, check_path_ids
from api.routes import (
    admin,
    batches,
    dashboard,
    files,
    fleet,
    health,
    inference,
    jobs,
    models,
    openapi,
    ui,
    uploads,
    usage,
    webhooks,
)
from api.streams import StreamSlots
from jobs.batches import progress
from jobs.core import logs, tracing
from jobs.core.context import Context
from jobs.core.schema import new_id
from jobs.core.settings import Settings
from jobs.slo import scaling
from jobs.slo.dashboard import viewer as dashboard_viewer
from jobs.tenants import auth


class App(Flask):
    """Flask, whose views may answer with a response model (``jobs.protocol.objects``):
    it is sent as its JSON, every field present."""

    def make_response(self, rv: Any) -> Response:
        if isinstance(rv, tuple) and rv and isinstance(rv[0], BaseModel):
            rv = (self.make_response(rv[0]), *rv[1:])  # (model, status[, headers])
        elif isinstance(rv, BaseModel):
            rv = Response(rv.model_dump_json(), mimetype="application/json")
        return super().make_response(rv)


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or Settings.from_env()
    logs.setup(settings)
    tracing.setup(settings, "api")
    app = App("inferq", static_folder=None)  # no /static/ of the working directory
    app.url_map.merge_slashes = False  # //v1//files is no route (not a redirect to one)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["inferq"] = Context(settings)
    app.extensions["inferq_streams"] = StreamSlots(settings.api_max_streams_per_project)
    app.extensions["inferq_watcher"] = progress.Watcher(app.extensions["inferq"],
                                                        settings.events_poll_s)
    errors.register(app)
    metrics.register(app, app.extensions["inferq"].redis)  # first: it times the whole request
    app.extensions["inferq_metrics"].register(scaling.collector(app.extensions["inferq"]))

    v1 = (files, uploads, batches, inference, jobs, models, webhooks)
    # The Admin API (OpenAI's /v1/organization/...): admin keys only, never project keys.
    organization = (admin, usage, fleet)

    @app.before_request
    def bound_body() -> None:
        """Every body is bounded, whatever its framing (a Content-Length or chunks):
        a file's upload by max_upload_bytes, an upload's part by max_upload_part_bytes
        (plus its form's framing), any other request by MAX_JSON_BODY (413). The stream
        stops one byte past the limit, so that a body over it can be told from one of
        exactly its length (api.request_parsing.json_body)."""
        if request.endpoint in files.UPLOADS:
            limit = settings.max_upload_bytes
        elif request.endpoint in uploads.PARTS:
            limit = settings.max_upload_part_bytes + uploads.FORM_SLACK
        else:
            limit = MAX_JSON_BODY
        request.max_content_length = limit + 1

    @app.before_request
    def trace_request() -> None:
        """Each request has an id (its ``x-request-id``: its log lines carry it, on the
        API and on the worker that answers it) and, when tracing is on, a SERVER span
        that ends when the response is closed (a stream: when it ends)."""
        logs.clear()
        g.request_id = new_id("req_")
        logs.bind(request_id=g.request_id)
        if tracing.enabled():
            rule = request.url_rule.rule if request.url_rule is not None else request.path
            g.trace_span = tracing.start(
                f"{request.method} {rule}", SpanKind.SERVER,
                parent={"traceparent": request.headers.get("traceparent")},
                attributes={"http.request.method": request.method, "http.route": rule,
                            "url.path": request.path, "inferq.request_id": g.request_id})
            g.trace_token = tracing.attach(g.trace_span)

    @app.before_request
    def authenticate() -> None:
        """Who may call a route is its blueprint's ``access`` (api/routes/contract.py):
        a project key, an admin key, either (the dashboard: a project key sees its own
        batches, an admin key every project's), or anyone."""
        bp = app.blueprints.get(request.blueprint or "")
        access = getattr(bp, "access", "public")
        if access == "public":
            return
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        if access == "admin":
            g.admin_key_id = auth.authenticate_admin(context(), key)
        elif access == "viewer":
            g.viewer = dashboard_viewer(context(), key)
            g.tenant_id = g.viewer.project_id
        else:
            g.tenant_id, g.api_key_id = auth.authenticate(context(), key)
            logs.bind(project_id=g.tenant_id)
        check_path_ids(request.view_args or {})

    @app.teardown_request
    def unbind_logs(_exc: BaseException | None) -> None:
        """A stream's request ends with its stream; nothing leaks into the next one."""
        logs.clear()

    @app.after_request
    def end_trace(resp: Response) -> Response:
        if "request_id" in g:
            resp.headers.setdefault("x-request-id", g.request_id)
        span = g.pop("trace_span", None)
        if span is not None:
            tracing.detach(g.pop("trace_token", None))
            code = resp.status_code
            span.set_attributes({"http.response.status_code": code,
                                 "inferq.project_id": g.get("tenant_id") or ""})
            resp.call_on_close(lambda: tracing.end(
                span, error=f"HTTP {code}" if code >= 500 else None))
        return resp

    @app.after_request
    def ratelimit_headers(resp: Response) -> Response:
        for k, v in g.get("ratelimit_headers", {}).items():
            resp.headers.setdefault(k, v)
        return resp

    for mod in (*v1, dashboard):
        app.register_blueprint(mod.bp, url_prefix="/v1")
    for mod in organization:
        app.register_blueprint(mod.bp, url_prefix="/v1/organization")
    app.register_blueprint(health.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(ui.bp)  # /dashboard: the web page, no key needed to load it

    return app
