"""The worker's Celery app, built from Settings; the model is loaded in the pool child.

Start with ``inferq worker --lanes realtime,batch``. A pool child that serves a
model lane loads the model once (``worker_process_init``), starts the engine
thread, the realtime consumer (if the lane is served) and the heartbeat, and
keeps them for its whole life.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from celery.signals import worker_process_init, worker_process_shutdown

from jobs.context import Context
from jobs.dispatch import make_celery
from jobs.settings import Settings

log = logging.getLogger("inferq.worker")
MODEL_LANES = {"realtime", "batch", "flex"}

settings = Settings.from_env()
app = make_celery(settings)
app.conf.imports = ("workers.tasks",)


@dataclass
class WorkerState:
    ctx: Context | None = None
    engine: Any = None
    model: Any = None
    threads: list[Any] = field(default_factory=list)

    def context(self) -> Context:
        if self.ctx is None:
            self.ctx = Context(settings)
        return self.ctx


state = WorkerState()


def start_model_runtime(st: Settings) -> None:
    """Load the model and start the engine; idempotent per process."""
    if state.engine is not None:
        return
    import torch

    from workers import lanes
    from workers.batching import BatchPolicy
    from workers.engine import Engine
    from workers.metrics import record_batch
    from workers.runtime.embeddings import EmbeddingModel

    if st.torch_threads:
        torch.set_num_threads(st.torch_threads)
    state.model = EmbeddingModel(st.embedding_model)
    state.engine = Engine(state.model, BatchPolicy(st.max_batch_tokens, st.max_batch_rows),
                          on_batch=record_batch)
    ctx = state.context()
    name = lanes.worker_name()
    info = {"name": name, "lanes": sorted(st.lane_set), "models": [st.embedding_model]}
    if "realtime" in st.lane_set:
        state.threads.append(lanes.RealtimeConsumer(ctx.redis, state.engine, state.model,
                                                    st.max_embedding_inputs))
    state.threads.append(lanes.Heartbeat(ctx.redis, name, info, st.worker_heartbeat_s))
    for t in state.threads:
        t.start()
    log.info("worker %s ready: lanes=%s model=%s", name, st.lanes, st.embedding_model)


@worker_process_init.connect
def _init_child(**_: Any) -> None:
    if settings.lane_set & MODEL_LANES:
        start_model_runtime(settings)


@worker_process_shutdown.connect
def _shutdown_child(**_: Any) -> None:
    for t in state.threads:
        t.stopping.set()
    if state.engine is not None:
        state.engine.stop()
