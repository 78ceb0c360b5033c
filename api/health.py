"""/healthz and /readyz (the stack can take work) and /metrics (with the metrics token
or an admin key)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response
from sqlalchemy import text

from api import context
from api import metrics as api_metrics
from jobs.dispatch import MODEL_LANES
from jobs.realtime import live_workers

bp = Blueprint("health", __name__)


def readiness() -> tuple[dict[str, Any], int]:
    """Ready: the database and Redis answer and at least one model worker's heartbeat
    is current. ``checks.lanes`` counts the live workers serving each lane."""
    ctx = context()
    checks: dict[str, Any] = {}
    try:
        with ctx.db.engine.connect() as c:
            c.execute(text("select 1"))
        checks["database"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported, not raised
        checks["database"] = f"error: {e.__class__.__name__}"
    try:
        ctx.redis.ping()
        lanes = {lane: {w["name"] for w in live_workers(ctx.redis, lane)} for lane in MODEL_LANES}
        checks["redis"] = "ok"
        checks["workers"] = len(set().union(*lanes.values()))
        checks["lanes"] = {lane: len(names) for lane, names in lanes.items()}
    except Exception as e:  # noqa: BLE001
        checks["redis"] = f"error: {e.__class__.__name__}"
        checks["workers"] = 0
        checks["lanes"] = dict.fromkeys(MODEL_LANES, 0)
    ok = checks["database"] == "ok" and checks["redis"] == "ok" and checks["workers"] > 0
    return {"status": "ok" if ok else "unavailable", "checks": checks}, 200 if ok else 503


@bp.get("/healthz")
def healthz() -> Any:
    return readiness()


@bp.get("/readyz")
def readyz() -> Any:
    """The same answer as /healthz, under the name orchestrators probe for readiness."""
    return readiness()


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus text format: the API's series (api/metrics.py), for the metrics token
    or an admin key only."""
    api_metrics.authorize(context())
    return api_metrics.exposition()
