"""/healthz (the stack can take work) and /metrics."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api import context
from jobs.realtime import live_workers

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Any:
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
        workers = live_workers(ctx.redis, "realtime") + live_workers(ctx.redis, "batch")
        checks["redis"] = "ok"
        checks["workers"] = len({w["name"] for w in workers})
    except Exception as e:  # noqa: BLE001
        checks["redis"] = f"error: {e.__class__.__name__}"
        checks["workers"] = 0
    ok = checks["database"] == "ok" and checks["redis"] == "ok" and checks["workers"] > 0
    return {"status": "ok" if ok else "unavailable", "checks": checks}, 200 if ok else 503


@bp.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(), mimetype=CONTENT_TYPE_LATEST)
