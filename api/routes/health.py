"""/healthz (liveness: the process serves), /readyz (readiness: the API can take work,
and what the live workers serve) and /metrics (with the metrics token or an admin
key)."""

from __future__ import annotations

from flask import Response, request
from sqlalchemy import text

from api import metrics as api_metrics
from api.current import context
from api.routes.contract import TEXT, Blueprint, names, parameter
from jobs.core.errors import InvalidRequest, shown
from jobs.core.lanes import MODEL_LANES
from jobs.fleet.heartbeats import live_workers
from jobs.protocol.objects.fleet import Health, HealthChecks, Liveness

bp = Blueprint("health", __name__)


def readiness(need: tuple[str, ...] = ()) -> tuple[Health, int]:
    """Ready: the database and Redis answer, so the API takes work (batches and jobs
    wait in their queues for workers). ``checks`` says what it can serve now: the live
    model workers, how many serve each lane (``lanes``) and the models they hold on
    each (``models``). ``need``: lanes that must have a live worker too."""
    ctx = context()
    try:
        with ctx.db.engine.connect() as c:
            c.execute(text("select 1"))
        database = "ok"
    except Exception as e:  # noqa: BLE001 - reported, not raised
        database = f"error: {e.__class__.__name__}"
    try:
        ctx.redis.ping()
        live = {lane: live_workers(ctx.redis, lane) for lane in MODEL_LANES}
        checks = HealthChecks(
            database=database, redis="ok",
            workers=len({w["name"] for ws in live.values() for w in ws}),
            lanes={lane: len({w["name"] for w in ws}) for lane, ws in live.items()},
            models={lane: sorted({ref.rsplit("@", 1)[0] for w in ws
                                  for ref in w.get("resident", [])})
                    for lane, ws in live.items()})
    except Exception as e:  # noqa: BLE001
        checks = HealthChecks(database=database, redis=f"error: {e.__class__.__name__}",
                              workers=0, lanes=dict.fromkeys(MODEL_LANES, 0),
                              models={lane: [] for lane in MODEL_LANES})
    ok = (checks.database == "ok" and checks.redis == "ok"
          and all(checks.lanes[lane] > 0 for lane in need))
    return Health(status="ok" if ok else "unavailable", checks=checks), 200 if ok else 503


@bp.get("/healthz", backend=False)
def healthz() -> Liveness:
    """Liveness: the process serves. No backend is asked, so a liveness probe never
    restarts an API that waits for its database, Redis or workers (/readyz says so)."""
    return Liveness()


@bp.get("/readyz", answers={
    503: "not ready: a backend, or a worker of a lane asked for, is missing"}, params=(parameter(
    "lane", "query", names(type="string", enum=list(MODEL_LANES)),
    description="lanes that must have a live worker"),))
def readyz() -> tuple[Health, int]:
    """Readiness (``readiness``); ``?lane=realtime`` (repeatable, or comma-separated)
    also needs a live worker on each lane named."""
    need = tuple(lane for v in request.args.getlist("lane") for lane in v.split(",") if lane)
    unknown = sorted(set(need) - set(MODEL_LANES))
    if unknown:
        raise InvalidRequest(f"lane must be one of {', '.join(MODEL_LANES)}, got "
                             f"{shown(unknown[0])}", param="lane")
    return readiness(need)


@bp.get("/metrics", media={"text/plain": TEXT}, errors={401, 403},
        security=("metrics", "admin"))
def metrics() -> Response:
    """Prometheus text format: the API's series (api/metrics.py), for the metrics token
    or an admin key only."""
    api_metrics.authorize(context())
    return api_metrics.exposition()
