"""/v1/dashboard: the overview (queues, workers, latencies, batches) and one batch with
its shards, for a project key (its own batches) or the admin key (every project's).
The shapes are the ones docs/API.md (Dashboard) describes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from flask import g, request

from api.current import context
from api.routes.contract import Blueprint
from jobs.core.schema import Shard
from jobs.slo import dashboard, stats

bp = Blueprint("dashboard", __name__, access="viewer")


@bp.get("/dashboard/overview")
def overview() -> Any:
    window = dashboard.parse_window(request.args.get("window"))
    o = dashboard.overview(context(), g.viewer, window)
    return {"object": "dashboard.overview", "scope": o.viewer.scope,
            "project_id": o.viewer.project_id, "generated_at": o.generated_at,
            "lanes": [{"lane": d.lane, "model": d.model, "queue_depth": d.depth}
                      for d in o.lanes],
            "workers": [asdict(w) for w in o.workers],
            "latency": {"window_s": o.window_s, "step_s": stats.STEP_S,
                        "series": [_series(s) for s in o.latency]},
            "batches": [batch_view(p) for p in o.batches]}


@bp.get("/dashboard/batches/<batch_id>")
def batch(batch_id: str) -> Any:
    p, shards = dashboard.batch_detail(context(), g.viewer, batch_id)
    return {"object": "dashboard.batch", "batch": batch_view(p),
            "shards": [_shard(sh) for sh in shards]}


def batch_view(p: dashboard.BatchProgress) -> dict[str, Any]:
    b = p.batch
    return {"id": b.id, "project_id": b.tenant_id, "status": b.status, "endpoint": b.endpoint,
            "model": b.model, "created_at": b.created_at,
            "request_counts": {"total": b.total, "completed": p.sums.completed,
                               "failed": p.sums.failed + b.invalid},
            "rate_per_s": p.rate_per_s, "eta_s": p.eta_s}


def _series(s: stats.Series) -> dict[str, Any]:
    return {"lane": s.lane, "metric": s.metric, "points": [asdict(pt) for pt in s.points],
            "summary": [asdict(x) for x in s.summaries]}


def _shard(sh: Shard) -> dict[str, Any]:
    return {"index": sh.index, "status": sh.status, "rows": sh.rows, "done": sh.rows_done,
            "worker": sh.worker, "attempts": sh.attempt}
