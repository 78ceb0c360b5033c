"""The batch lane: shards of batch files, delivered by Celery on the batch and flex
queues and run by the shard pipeline on this worker's engines.

``run_shard`` is what the shard task does; ``ShardConsumers`` stops this worker
taking shards while its circuit breaker is open.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from celery import Celery

from jobs.batches import fairshare
from jobs.core import logs, refs, tracing
from jobs.core.context import Context
from jobs.core.dispatch import lane_queues, shard_queue, shard_ref
from jobs.core.lanes import SHARD_LANES, lane_for
from jobs.core.schema import Batch
from jobs.core.status import RESUMED_ELSEWHERE, ShardOutcome
from workers.process import metrics

if TYPE_CHECKING:  # torch stays out of processes that serve no model lane
    from workers.process.runtime import WorkerRuntime

log = logging.getLogger("inferq.batch_lane")
SHARD_QUEUES = SHARD_LANES


def run_shard(rt: WorkerRuntime, shard_id: str, stop_requested: Callable[[], bool],
              queue: str | None = None) -> ShardOutcome:
    """Run the shard from its checkpoint, then send what follows: the batch's finalize
    if it was the last shard, or the shard again if another worker must resume it
    (it keeps its place: still dispatched), and then the lane's next shards by fair
    dispatch (jobs/batches/fairshare.py), before this message is acknowledged.

    A shard taken from the queue of a version (``queue``) this worker no longer holds
    (unloaded while its message was on its way here) is sent again, unclaimed: to the
    workers holding that version, or placed anew (jobs.fleet.placement)."""
    from workers.shards import pipeline

    ctx = rt.ctx
    batch_id = refs.batch_of(shard_id)
    tier, project, model_ref = batch_owner(ctx, batch_id)
    logs.bind(project_id=project)
    tracing.annotate({"inferq.project_id": project, "inferq.service_tier": tier})
    lane = lane_for(tier)
    if model_ref and queue == shard_queue(lane, model_ref) \
            and model_ref not in rt.resident():
        fairshare.enqueue_shards(ctx, [shard_id])
        log.info("shard %s: handed back (%s is no longer held here)", shard_id, model_ref)
        metrics.SHARDS.labels(lane, ShardOutcome.HANDED_BACK).inc()
        return ShardOutcome.HANDED_BACK
    with metrics.SHARDS_IN_FLIGHT.labels(lane).track_inprogress():
        result = pipeline.process_shard(ctx, rt.runner_for, shard_id, rt.name,
                                        stop_requested=stop_requested,
                                        healthy=rt.breaker.allow)
    metrics.SHARDS.labels(lane, result.outcome).inc()
    if result.outcome in (ShardOutcome.RETRY, ShardOutcome.HANDED_BACK):
        metrics.RETRIES.labels(f"shard:{result.outcome}").inc()
    if result.finalize:
        ctx.dispatcher.finalize(batch_id)
    elif result.outcome in RESUMED_ELSEWHERE:
        ctx.dispatcher.shards([shard_id], tier, model_ref, countdown=result.retry_in_s)
    fairshare.dispatch_quietly(ctx, lane)
    log.info("shard %s: %s", shard_id, result.outcome)
    tracing.annotate({"inferq.outcome": str(result.outcome)})
    return result.outcome


def batch_owner(ctx: Context, batch_id: str) -> tuple[str, str | None, str | None]:
    """The batch's service tier, project and pinned model version (``name@version``)."""
    with ctx.db.session() as s:
        b = s.get(Batch, batch_id)
        if b is None:
            return "default", None, None
        return b.service_tier, b.tenant_id, shard_ref(b.model, b.model_version)


class ShardConsumers:
    """This worker's Celery consumers of the shard queues it serves: those of its shard
    lanes (``queues``, given to Celery by ``-Q``), and per lane one for each model
    version it holds (``refs``). ``hostname`` (the Celery node name) is learnt from the
    first shard task."""

    def __init__(self, app: Celery, lanes: set[str]) -> None:
        self.app = app
        self.queues = [q for q in lane_queues(lanes) if q in SHARD_QUEUES]
        self.refs: list[str] = []
        self.hostname: str | None = None

    def queues_for(self, refs: list[str]) -> list[str]:
        """The queues to consume while holding ``refs``: the plain lane queues (shards
        sent before versions had queues of their own) and each version's."""
        return self.queues + [shard_queue(q, ref) for q in self.queues for ref in refs]

    def pause(self, cooldown_s: float) -> None:
        """The breaker opened: stop taking shards for the cooldown, then take them again."""
        log.error("model keeps failing: taking no work for %.0f s", cooldown_s)
        host = self.hostname
        queues = self.queues_for(self.refs)
        if not host or not queues:
            return
        for q in queues:
            self.app.control.cancel_consumer(q, destination=[host])

        def resume() -> None:
            for q in queues:
                self.app.control.add_consumer(q, destination=[host])

        threading.Timer(cooldown_s, resume).start()
