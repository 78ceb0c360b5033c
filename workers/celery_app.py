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
MODEL_LANES = {"realtime", "jobs", "batch", "flex"}

settings = Settings.from_env()
app = make_celery(settings)
app.conf.imports = ("workers.tasks",)


@dataclass
class WorkerState:
    ctx: Context | None = None
    engine: Any = None  # embeddings Engine
    model: Any = None  # EmbeddingModel
    generator: Any = None  # GenerationEngine, when a chat model is registered
    threads: list[Any] = field(default_factory=list)

    def context(self) -> Context:
        if self.ctx is None:
            self.ctx = Context(settings)
        return self.ctx

    def runner_for(self, endpoint: str) -> Any:
        from jobs.errors import Unavailable
        from jobs.requests import EMBEDDINGS
        from workers.runners import EmbeddingRunner, GenerationRunner

        if endpoint == EMBEDDINGS:
            return EmbeddingRunner(self.engine, self.model, settings.max_embedding_inputs)
        if self.generator is None:
            raise Unavailable("no chat model is loaded on this worker")
        return GenerationRunner(self.generator, endpoint)


state = WorkerState()


def _model_dir(ctx: Context, name: str) -> Any:
    """The model's files from the repository, cached on local disk; None if not imported."""
    from jobs import registry
    from workers.runtime.cache import local_dir

    m = registry.get_default(ctx, name)
    return local_dir(ctx, m) if m is not None else None


def start_model_runtime(st: Settings) -> None:
    """Load the models and start the engines and lane consumers; idempotent per process."""
    if state.engine is not None:
        return
    import torch

    from workers import lanes
    from workers.batching import BatchPolicy
    from workers.engine import Engine
    from workers.generation import GenerationEngine
    from workers.metrics import record_batch, record_step
    from workers.runtime.chat import ChatModel
    from workers.runtime.embeddings import EmbeddingModel

    if st.torch_threads:
        torch.set_num_threads(st.torch_threads)
    ctx = state.context()
    state.model = EmbeddingModel(st.embedding_model, path=_model_dir(ctx, st.embedding_model))
    state.engine = Engine(state.model, BatchPolicy(st.max_batch_tokens, st.max_batch_rows),
                          on_batch=record_batch)
    models = [st.embedding_model]
    chat_dir = _model_dir(ctx, st.chat_model) if st.chat_model else None
    if chat_dir is not None:
        state.generator = GenerationEngine(ChatModel(st.chat_model, chat_dir),
                                           max_batch_rows=st.max_generation_rows,
                                           max_rows=st.max_generation_rows * 2,
                                           on_step=record_step)
        models.append(st.chat_model)
    name = lanes.worker_name()
    info = {"name": name, "lanes": sorted(st.lane_set), "models": models}
    if "realtime" in st.lane_set:
        state.threads.append(lanes.RealtimeConsumer(ctx.redis, state.engine, state.model,
                                                    st.max_embedding_inputs, state.generator))
    if "jobs" in st.lane_set:
        state.threads.append(lanes.JobsConsumer(ctx, state.engine, state.model,
                                                state.generator, name))
    state.threads.append(lanes.Heartbeat(ctx.redis, name, info, st.worker_heartbeat_s,
                                         stats=_stats))
    for t in state.threads:
        t.start()
    log.info("worker %s ready: lanes=%s models=%s", name, st.lanes, models)


def _stats() -> dict[str, Any]:
    out: dict[str, Any] = {}
    if state.engine is not None:
        e = state.engine.stats
        out["embeddings"] = {"batches": e.batches, "rows": e.rows,
                             "real_tokens": e.real_tokens, "computed_tokens": e.computed_tokens}
    if state.generator is not None:
        out["generation"] = state.generator.stats.snapshot()
    return out


@worker_process_init.connect
def _init_child(**_: Any) -> None:
    if settings.lane_set & MODEL_LANES:
        start_model_runtime(settings)


@worker_process_shutdown.connect
def _shutdown_child(**_: Any) -> None:
    for t in state.threads:
        t.stopping.set()
    for engine in (state.engine, state.generator):
        if engine is not None:
            engine.stop()
