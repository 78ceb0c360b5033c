"""What a model-serving pool process holds: its typed dependencies (``WorkerRuntime``),
built once in the pool child by ``build_runtime`` and handed explicitly to the lanes
it starts and to the shard task.

Which model to load is looked up in the registry (``jobs.registry``), by the
names the worker's settings give: the registry's row says what the model is (its
kind and context length); its files come from the repository, cached on local
disk.

The accelerator (``INFERQ_ACCELERATOR``): ``auto`` loads the models with torch;
``simulated`` serves the embedding model on the simulated accelerator
(``workers.runtime.simulated``: its tokenizer only, a forward pass that sleeps for a
profile's cost) and no chat model. The torch-bound modules are imported only where a
real model is loaded, so a simulated worker process never imports torch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from jobs.admission import ServiceMeter
from jobs.context import Context
from jobs.errors import ModelNotLoaded, Unavailable
from jobs.registry import CHAT_KIND, EMBEDDINGS_KIND
from jobs.requests import EMBEDDINGS
from jobs.settings import Settings
from workers import metrics
from workers.batching import BatchPolicy
from workers.breaker import Breaker
from workers.embedding_engine import EmbeddingEngine
from workers.heartbeat import Heartbeat, worker_name
from workers.jobs_lane import JobsConsumer
from workers.realtime_lane import RealtimeConsumer, UsageWriter
from workers.runners import EmbeddingRunner, GenerationRunner, Runner
from workers.runtime import simulated
from workers.runtime.cache import registered
from workers.runtime.embedding_inputs import EmbeddingInputs

if TYPE_CHECKING:  # torch-bound: imported where a real model is loaded
    from workers.generation import GenerationEngine
    from workers.runtime.embeddings import EmbeddingModel

log = logging.getLogger("inferq.worker")


class Service(Protocol):
    """A background thread of the worker, stopped at the pool child's shutdown."""

    stopping: threading.Event

    def start(self) -> None: ...

    def stop(self) -> None:
        """Stop taking work and release what the service holds."""


class LazyGenerationEngine:
    """The generation engine, its chat model loaded on first use and kept resident.

    Loaded lazily: a worker that only ever serves embeddings keeps the CPU/GPU
    to itself (INFERQ_PRELOAD_CHAT_MODEL=1 loads it at start instead)."""

    def __init__(self, ctx: Context, settings: Settings) -> None:
        self.ctx, self.settings = ctx, settings
        self.loaded: GenerationEngine | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str | None:
        """The chat model this worker serves (loaded or not), None if it serves none."""
        return self.settings.chat_model or None

    def get(self, model: str) -> GenerationEngine:
        """The engine for a request for ``model``; ModelNotLoaded when this worker does
        not serve that model, Unavailable when its chat model cannot be had."""
        if model != self.name:
            raise ModelNotLoaded(model)
        with self._lock:
            if self.loaded is None:
                self.loaded = self._load()
            return self.loaded

    def _load(self) -> GenerationEngine:
        from workers.generation import GenerationEngine
        from workers.prefix_cache import WORTH_TOKENS, PrefixCache
        from workers.runtime.chat import ChatModel

        st = self.settings
        try:
            found = registered(self.ctx, st.chat_model, CHAT_KIND) if st.chat_model else None
        except ValueError as e:  # configured with a model of another kind
            raise Unavailable(f"this worker serves no chat model: {e}") from e
        if found is None:
            raise Unavailable("this worker serves no chat model (run `inferq models "
                              "import` and set INFERQ_CHAT_MODEL)")
        m, path = found
        model = ChatModel(st.chat_model, path, context_length=m.context_length,
                          fault_oom_above_tokens=st.fault_oom_above_tokens,
                          precision=m.precision)
        cache = (PrefixCache(st.prefix_cache_mb << 20, min_hit_tokens=WORTH_TOKENS)
                 if st.prefix_cache_mb > 0 else None)
        return GenerationEngine(model, max_batch_rows=st.max_generation_rows,
                                max_rows=st.max_generation_rows * 2,
                                max_prefill_tokens=st.max_prefill_tokens,
                                batch_prefill_tokens=st.batch_prefill_tokens,
                                realtime_quiet_s=st.realtime_quiet_s,
                                on_step=metrics.step_recorder(st.chat_model),
                                prefix_cache=cache)


@dataclass(frozen=True)
class WorkerRuntime:
    """One pool child's models, engines, breaker and lane threads."""

    settings: Settings
    ctx: Context
    name: str  # as in heartbeats and leases
    breaker: Breaker
    embedding_model: EmbeddingInputs
    embeddings: EmbeddingEngine
    chat: LazyGenerationEngine
    accelerator: str  # cuda, cpu (torch's device) or simulated
    threads: list[Service] = field(default_factory=list)
    service: ServiceMeter = field(default_factory=ServiceMeter)  # realtime, for admission

    def runner_for(self, endpoint: str) -> Runner:
        """How the shard pipeline feeds rows of ``endpoint`` to this worker's engines."""
        if endpoint == EMBEDDINGS:
            return EmbeddingRunner(self.embeddings, self.embedding_model,
                                   self.settings.max_embedding_inputs)
        return GenerationRunner(self.chat.get, endpoint)

    def models(self) -> list[str]:
        """The models this worker serves: its embedding model, and its chat model (loaded
        on the first request for it). The API routes realtime requests by these."""
        return [self.embedding_model.model_id] + ([self.chat.name] if self.chat.name else [])

    def describe(self) -> dict[str, Any]:
        """What the heartbeat announces: lanes, models, breaker state, engine counters,
        and where this process's metrics are scraped."""
        out = {"name": self.name, "lanes": sorted(self.settings.lane_set),
               "breaker": self.breaker.state, "models": self.models(), "stats": self.stats(),
               "metrics_url": metrics.url(), "service": self.service.snapshot(),
               "accelerator": self.accelerator}
        if self.accelerator == simulated.ACCELERATOR:
            out["simulated_profile"] = self.settings.simulated_profile
        return out

    def stats(self) -> dict[str, Any]:
        e = self.embeddings.stats
        out: dict[str, Any] = {"embeddings": {
            "batches": e.batches, "rows": e.rows, "real_tokens": e.real_tokens,
            "computed_tokens": e.computed_tokens}}
        gen = self.chat.loaded
        if gen is not None:
            out["generation"] = gen.stats.snapshot()
        return out

    def stop(self) -> None:
        """Called at the pool child's shutdown: lanes stop reading, engines stop, then
        each lane releases what it holds (the jobs lane's writes finish)."""
        for t in self.threads:
            t.stopping.set()
        self.embeddings.stop()
        if self.chat.loaded is not None:
            self.chat.loaded.stop()
        for t in self.threads:
            t.stop()


def build_runtime(settings: Settings, ctx: Context,
                  on_breaker_open: Callable[[float], None]) -> WorkerRuntime:
    """Load the models, start the engines, then the lanes this worker serves and its
    heartbeat. Called once per pool child that serves a model lane."""
    model: EmbeddingModel | simulated.SimulatedEmbeddingModel
    accelerator: str
    if settings.accelerator == simulated.ACCELERATOR:
        # Embeddings only: the simulated accelerator runs no chat model.
        settings = settings.model_copy(update={"chat_model": ""})
        model = simulated.load_embedding_model(settings, ctx)
        accelerator = simulated.ACCELERATOR
    else:
        if settings.torch_threads:
            import torch

            torch.set_num_threads(settings.torch_threads)
        model = load_embedding_model(settings, ctx)
        accelerator = model.device.type
    breaker = Breaker(settings.breaker_threshold, settings.breaker_cooldown_s)
    breaker.on_open.append(on_breaker_open)
    engine = EmbeddingEngine(model, BatchPolicy(settings.max_batch_tokens,
                                                settings.max_batch_rows),
                             on_batch=metrics.batch_recorder(model.model_id),
                             on_pass=breaker.record)
    rt = WorkerRuntime(settings, ctx, worker_name(), breaker, model, engine,
                       LazyGenerationEngine(ctx, settings), accelerator,
                       service=ServiceMeter(settings.admission_service_window_s))
    metrics.register_runtime(rt)
    if settings.preload_chat_model and rt.chat.name:
        rt.chat.get(rt.chat.name)
    _start_lanes(rt)
    where: str = accelerator
    if accelerator == simulated.ACCELERATOR:
        where = (f"simulated accelerator, profile {settings.simulated_profile} "
                 "(embeddings only)")
    log.info("worker %s ready: lanes=%s models=%s accelerator=%s", rt.name, settings.lanes,
             rt.models(), where)
    return rt


def load_embedding_model(settings: Settings, ctx: Context) -> EmbeddingModel:
    """The worker's embedding model, as its registry row describes it."""
    from workers.runtime.embeddings import EmbeddingModel

    found = registered(ctx, settings.embedding_model, EMBEDDINGS_KIND)
    if found is None:
        raise RuntimeError(f"the embedding model {settings.embedding_model!r} is not "
                           "registered: run `inferq models import` first")
    m, path = found
    return EmbeddingModel(m.name, path, max_length=m.context_length,
                          fault_oom_above_tokens=settings.fault_oom_above_tokens,
                          fault_fail=settings.fault_model_fails, precision=m.precision)


def _start_lanes(rt: WorkerRuntime) -> None:
    st, lanes = rt.settings, rt.settings.lane_set
    if "realtime" in lanes:
        rt.threads.append(RealtimeConsumer(rt.ctx.redis, rt.models(), rt.embeddings,
                                           rt.embedding_model, st.max_embedding_inputs,
                                           rt.chat.get, allow=rt.breaker.allow,
                                           meter=UsageWriter(rt.ctx), service=rt.service,
                                           max_pending=st.max_batch_rows))
    if "jobs" in lanes:
        rt.threads.append(JobsConsumer(rt.ctx, rt.embeddings, rt.embedding_model, rt.chat.get,
                                       rt.name, allow=rt.breaker.allow))
    rt.threads.append(Heartbeat(rt.ctx.redis, rt.name, rt.describe, st.worker_heartbeat_s))
    rt.threads.append(metrics.history_flusher(rt.ctx.redis))  # the dashboard's latencies
    for t in rt.threads:
        t.start()
