"""The control lane's background threads: the janitor and the webhook deliveries, run
beside the control tasks (validate, finalize) in a pool child that serves the lane."""

from __future__ import annotations

import contextlib
import logging
import threading

import redis

from jobs.batches.janitor import sweep
from jobs.core.context import Context
from jobs.realtime import taken
from workers.process.metrics import record_sweep

log = logging.getLogger("inferq.janitor")


class JanitorThread(threading.Thread):
    """Runs ``jobs.batches.janitor.sweep`` every ``every_s`` until stopped, and gives the
    realtime requests a dead worker had taken to other workers
    (``jobs.realtime.taken.reap``, as live realtime workers also do each second)."""

    def __init__(self, ctx: Context, every_s: float) -> None:
        super().__init__(name="inferq-janitor", daemon=True)
        self.ctx, self.every_s = ctx, every_s
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            with contextlib.suppress(redis.RedisError):
                taken.reap(self.ctx.redis)
            try:
                rep = sweep(self.ctx)
                record_sweep(len(rep.requeued), len(rep.failed), len(rep.expired))
                if rep.requeued or rep.failed or rep.expired:
                    log.info("janitor: requeued %s, failed %s, expired %s", rep.requeued,
                             rep.failed, rep.expired)
            except Exception as e:  # noqa: BLE001 - the next sweep tries again
                log.warning("janitor: %s", e)


class DeliveryThread(threading.Thread):
    """Runs the webhook delivery loop (``jobs.webhooks.deliveries``) until stopped: beside the
    janitor, never on an engine."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(name="inferq-webhooks", daemon=True)
        self.ctx = ctx
        self.stopping = threading.Event()

    def run(self) -> None:
        from jobs.webhooks.deliveries import Deliverer

        Deliverer(self.ctx).run(self.stopping)
