"""The worker's Celery app, built from Settings; the model is loaded in the pool child.

Start with ``inferq worker --lanes realtime,batch``. A pool child that serves a
model lane loads the model once (``worker_process_init``), starts the engine
thread, the realtime consumer (if the lane is served) and the heartbeat, and
keeps them for its whole life.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)

from jobs.context import Context
from jobs.dispatch import lane_queues, make_celery
from jobs.settings import Settings
from workers.breaker import Breaker

log = logging.getLogger("inferq.worker")
MODEL_LANES = {"realtime", "jobs", "batch", "flex"}

settings = Settings.from_env()
app = make_celery(settings)
app.conf.imports = ("workers.tasks",)


@dataclass
class WorkerState:
    ctx: Context | None = None
    engine: Any = None  # embeddings EmbeddingEngine
    model: Any = None  # EmbeddingModel
    generator: Any = None  # GenerationEngine, when a chat model is registered
    threads: list[Any] = field(default_factory=list)
    breaker: Breaker = field(default_factory=lambda: Breaker(settings.breaker_threshold,
                                                             settings.breaker_cooldown_s))
    hostname: str | None = None  # the Celery node name, learnt from the first task
    lock: threading.Lock = field(default_factory=threading.Lock)

    def context(self) -> Context:
        if self.ctx is None:
            self.ctx = Context(settings)
        return self.ctx

    def tier(self, batch_id: str) -> str:
        from jobs.models import Batch

        with self.context().db.session() as s:
            b = s.get(Batch, batch_id)
            return b.service_tier if b is not None else "default"

    def runner_for(self, endpoint: str) -> Any:
        from jobs.requests import EMBEDDINGS
        from workers.runners import EmbeddingRunner, GenerationRunner

        if endpoint == EMBEDDINGS:
            return EmbeddingRunner(self.engine, self.model, settings.max_embedding_inputs)
        return GenerationRunner(self.chat(), endpoint)

    def chat(self) -> Any:
        """The generation engine, its model loaded on first use and kept resident.

        Loaded lazily: a worker that only ever serves embeddings keeps the CPU/GPU
        to itself (INFERQ_PRELOAD_CHAT_MODEL=1 loads it at start instead)."""
        from jobs.errors import Unavailable

        with self.lock:
            if self.generator is None:
                from workers.generation import GenerationEngine
                from workers.metrics import record_step
                from workers.runtime.chat import ChatModel

                path = _model_dir(self.context(), settings.chat_model) \
                    if settings.chat_model else None
                if path is None:
                    raise Unavailable("this worker serves no chat model (run `inferq models "
                                      "import` and set INFERQ_CHAT_MODEL)")
                self.generator = GenerationEngine(
                    ChatModel(settings.chat_model, path,
                              fault_oom_above_tokens=settings.fault_oom_above_tokens),
                    max_batch_rows=settings.max_generation_rows,
                    max_rows=settings.max_generation_rows * 2, on_step=record_step)
            return self.generator


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
    from workers.embedding_engine import EmbeddingEngine
    from workers.metrics import record_batch
    from workers.runtime.embeddings import EmbeddingModel

    if st.torch_threads:
        torch.set_num_threads(st.torch_threads)
    ctx = state.context()
    state.model = EmbeddingModel(st.embedding_model, path=_model_dir(ctx, st.embedding_model),
                                 fault_oom_above_tokens=st.fault_oom_above_tokens,
                                 fault_fail=st.fault_model_fails)
    state.engine = EmbeddingEngine(state.model, BatchPolicy(st.max_batch_tokens, st.max_batch_rows),
                          on_batch=record_batch, on_pass=state.breaker.record)
    state.breaker.on_open.append(_pause_consumers)
    if st.preload_chat_model:
        state.chat()
    name = lanes.worker_name()
    info: dict[str, Any] = {
        "name": name, "lanes": sorted(st.lane_set), "breaker": lambda: state.breaker.state,
        "models": lambda: [st.embedding_model] + ([st.chat_model] if state.generator else [])}
    if "realtime" in st.lane_set:
        state.threads.append(lanes.RealtimeConsumer(ctx.redis, state.engine, state.model,
                                                    st.max_embedding_inputs, state.chat,
                                                    allow=state.breaker.allow))
    if "jobs" in st.lane_set:
        state.threads.append(lanes.JobsConsumer(ctx, state.engine, state.model,
                                                state.chat, name,
                                                allow=state.breaker.allow))
    state.threads.append(lanes.Heartbeat(ctx.redis, name, info, st.worker_heartbeat_s,
                                         stats=_stats))
    for t in state.threads:
        t.start()
    log.info("worker %s ready: lanes=%s models=%s", name, st.lanes, info["models"]())


def _pause_consumers(cooldown_s: float) -> None:
    """The breaker opened: stop taking shards for the cooldown, then take them again."""
    queues = [q for q in lane_queues(settings.lane_set) if q in ("batch", "flex")]
    host = state.hostname
    log.error("model keeps failing: taking no work for %.0f s", cooldown_s)
    if not host or not queues:
        return
    for q in queues:
        app.control.cancel_consumer(q, destination=[host])

    def resume() -> None:
        for q in queues:
            app.control.add_consumer(q, destination=[host])

    threading.Timer(cooldown_s, resume).start()


def _stats() -> dict[str, Any]:
    out: dict[str, Any] = {}
    if state.engine is not None:
        e = state.engine.stats
        out["embeddings"] = {"batches": e.batches, "rows": e.rows,
                             "real_tokens": e.real_tokens, "computed_tokens": e.computed_tokens}
    if state.generator is not None:
        out["generation"] = state.generator.stats.snapshot()
    return out


def _drain_flag(main_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"inferq-drain-{main_pid}"


def draining() -> bool:
    """True once this worker is shutting down (SIGTERM: a spot notice or a deploy).

    ``worker_shutting_down`` fires in the main process only; the flag file is how
    the pool child, between chunks, learns that it should commit and hand back."""
    return _drain_flag(os.getppid()).exists()


@worker_init.connect
def _init_main(**_: Any) -> None:
    _drain_flag(os.getpid()).unlink(missing_ok=True)


@worker_shutting_down.connect
def _shutting_down(how: str = "Warm", **_: Any) -> None:
    """A warm shutdown (SIGTERM): the shard in flight commits its chunk and is handed
    back. A spot worker escalates to a cold shutdown (tasks cancelled, messages
    restored) if that has not happened within the notice."""
    _drain_flag(os.getpid()).touch()
    if settings.spot and how == "Warm":
        t = threading.Timer(settings.spot_notice_s, os.kill, (os.getpid(), signal.SIGQUIT))
        t.daemon = True
        t.start()


@worker_process_init.connect
def _init_child(**_: Any) -> None:
    if settings.lane_set & MODEL_LANES:
        start_model_runtime(settings)
    if "control" in settings.lane_set:
        from workers.lanes import Janitor

        janitor = Janitor(state.context(), settings.janitor_interval_s)
        state.threads.append(janitor)
        janitor.start()


@worker_process_shutdown.connect
def _shutdown_child(**_: Any) -> None:
    for t in state.threads:
        t.stopping.set()
    for engine in (state.engine, state.generator):
        if engine is not None:
            engine.stop()
