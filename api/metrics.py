"""The API's Prometheus series, served on GET /metrics (api/routes/health.py).

Per request: its latency (until the response, a stream's included, is fully sent)
by route, method, lane, model and status; a count by route, method and status; errors
by status and code (the ``code`` of the OpenAI error body). Every label takes values
this service defines, never one a client makes up: ``route`` is the URL rule
(``/v1/batches/<batch_id>``), never the path, and ``<unmatched>`` for a path no rule
serves; ``method`` is one of ``METHODS`` or ``other``; ``model`` one the catalog
validated (set by ``api.current.admit``), else empty. No project, key or request id is a
label: what each project used is in usage accounting (``/v1/organization/usage``).

At scrape time: the depth of every lane's queue in Redis (``QueueDepthCollector``):
the Celery lists of control, batch and flex, the jobs list and each model's
realtime list (``jobs.slo.dashboard.queue_depths``).

Who may read them (``authorize``): a request with ``Authorization: Bearer`` and the
metrics token (``INFERQ_METRICS_TOKEN``, compared in constant time; what Prometheus
sends), or with an admin key. Anyone else is answered 401 (a project key 403), in the
OpenAI error shape.

One process per API: the API runs as one gunicorn process (``cli/stack.py``
``api_command``, ``docker/Dockerfile.api``), so this process's registry holds all of
its series; more capacity is more API processes (containers, replicas), each scraped
as its own target. Under ``gunicorn -w N`` each scrape would see one of the N
processes only, which is why the API does not run that way.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from typing import Any

import redis
from flask import Flask, Response, current_app, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.core.context import Context
from jobs.core.errors import PermissionDenied, Unauthorized
from jobs.core.lanes import BATCH, JOBS, REALTIME
from jobs.slo import dashboard
from jobs.tenants import auth

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
REQUEST_SECONDS = Histogram("inferq_api_request_seconds",
                            "API request latency, until the response is fully sent",
                            ["route", "method", "lane", "model", "status"], buckets=BUCKETS)
REQUESTS = Counter("inferq_api_requests", "API requests answered",
                   ["route", "method", "status"])
ERRORS = Counter("inferq_api_errors", "API error responses, by the error body's code",
                 ["route", "status", "code"])

# The methods a request is counted under; any other (a client may send any token as a
# method) is "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "<unmatched>"  # the route of a request that no URL rule serves

# The lane a route's work runs on.
LANE_OF_ROUTE = {"/v1/embeddings": REALTIME, "/v1/chat/completions": REALTIME,
                 "/v1/completions": REALTIME, "/v1/responses": REALTIME,
                 "/v1/jobs": JOBS, "/v1/batches": BATCH}


class QueueDepthCollector(Collector):
    """``inferq_queue_depth{lane, model}``: messages waiting on each lane's Redis lists,
    read when scraped (``jobs.slo.dashboard.queue_depths``, which the dashboard shows too)."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        depth = GaugeMetricFamily("inferq_queue_depth", "Messages waiting on a lane's queue",
                                  labels=["lane", "model"])
        try:
            depths = dashboard.queue_depths(self.r)
        except redis.RedisError:
            return  # Redis is down: no depth rather than a wrong one
        for d in depths:
            depth.add_metric([d.lane, d.model or ""], d.depth)
        yield depth


def register(app: Flask, r: redis.Redis) -> None:
    """Time and count every request of ``app``; its scrape-time series in a registry of
    its own (several apps may live in one test process)."""
    own = CollectorRegistry(auto_describe=False)
    own.register(QueueDepthCollector(r))
    app.extensions["inferq_metrics"] = own

    @app.before_request
    def _start() -> None:
        g.metrics_t0 = time.perf_counter()

    @app.after_request
    def _observe(resp: Response) -> Response:
        t0 = g.get("metrics_t0")
        if t0 is None:
            return resp
        route = request.url_rule.rule if request.url_rule is not None else UNMATCHED
        method = request.method if request.method in METHODS else "other"
        status = str(resp.status_code)
        lane = LANE_OF_ROUTE.get(route, "") if method == "POST" else ""
        model = str(g.get("metrics_model") or "")
        REQUESTS.labels(route, method, status).inc()
        if resp.status_code >= 400:
            ERRORS.labels(route, status, _error_code(resp)).inc()
        hist = REQUEST_SECONDS.labels(route, method, lane, model, status)
        resp.call_on_close(lambda: hist.observe(time.perf_counter() - t0))
        return resp


def _error_code(resp: Response) -> str:
    if resp.is_streamed or resp.mimetype != "application/json":
        return ""
    body = resp.get_json(silent=True)
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else ""


def authorize(ctx: Context) -> None:
    """Let the request read the metrics, or raise: the metrics token (constant time, no
    database needed) or an admin key; none, or another, is a 401, a project key 403."""
    header = request.headers.get("Authorization", "")
    key = header[7:].strip() if header.lower().startswith("bearer ") else ""
    token = ctx.settings.metrics_token
    if token and key and hmac.compare_digest(key.encode(), token.encode()):
        return
    challenge = {"www-authenticate": 'Bearer realm="metrics"'}
    if not key:
        raise Unauthorized("Missing credentials: /metrics needs 'Authorization: Bearer "
                           "<metrics token>' (INFERQ_METRICS_TOKEN) or an admin key",
                           headers=challenge)
    try:
        auth.authenticate_admin(ctx, key)
    except PermissionDenied:
        raise PermissionDenied("a project API key cannot read /metrics: send the metrics "
                               "token (INFERQ_METRICS_TOKEN) or an admin key") from None
    except Unauthorized:
        raise Unauthorized("Incorrect metrics token or admin key provided",
                           headers=challenge) from None


def exposition() -> Response:
    """The process's series and the app's scrape-time ones, in the text format."""
    own: CollectorRegistry | None = current_app.extensions.get("inferq_metrics")
    body = generate_latest(REGISTRY) + (generate_latest(own) if own is not None else b"")
    return Response(body, mimetype=CONTENT_TYPE_LATEST)
