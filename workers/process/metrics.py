"""Prometheus metrics of a worker process, served on its own port.

Every pool child (model lanes and control) starts ``serve`` after the fork and
announces the URL in its heartbeat (``metrics_url``); ``inferq up`` gives each worker
it starts a fixed port (so the URL it prints outlives a restart) and prints them, and
``docker/prometheus.yml`` scrapes them. Labels stay bounded: lane, model, kind,
task; never a request id, a project or a key (what a project used is in usage
accounting, not in any series).

Series measured per event (histograms, counters) are recorded by the engines and
lanes through the ``record_*`` / ``observe_*`` functions here; the ones that are a
state (breaker, rows and tokens by lane, accelerator memory) are read at scrape time
by ``RuntimeCollector``, so nothing is computed between scrapes. Accelerator series
exist only where torch sees a CUDA device: absent, never zero, on a CPU worker.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from jobs.core.dispatch import TASK_FINALIZE, TASK_SHARD, TASK_VALIDATE
from jobs.core.lanes import MODEL_LANES
from jobs.core.status import BreakerState
from jobs.slo import stats

if TYPE_CHECKING:
    from redis import Redis

    from workers.process.runtime import WorkerRuntime

log = logging.getLogger("inferq.metrics")

LANES = MODEL_LANES  # engine priorities 0..3, in that order
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)
LATENCY_BUCKETS = stats.BOUNDS  # the dashboard's per-minute history uses the same buckets
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Engine steps (one micro-batch of embeddings, one prefill+decode step of generation):
# the service rate per model comes from these.
STEP_SECONDS = Histogram("inferq_engine_step_seconds", "Model time per engine step",
                         ["engine", "model"], buckets=STEP_BUCKETS)
STEP_ROWS = Histogram("inferq_engine_step_rows", "Rows (sequences) per engine step",
                      ["engine", "model"], buckets=ROW_BUCKETS)
STEP_TOKENS = Histogram("inferq_engine_step_tokens",
                        "Tokens computed per embedding micro-batch (padding included)",
                        ["model"], buckets=TOKEN_BUCKETS)
PADDING = Histogram("inferq_engine_padding_efficiency",
                    "Real tokens / computed tokens of each embedding micro-batch",
                    ["model"], buckets=(0.1, 0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0))
REAL_TOKENS = Counter("inferq_engine_real_tokens", "Embedding tokens that carried input",
                      ["model"])
COMPUTED_TOKENS = Counter("inferq_engine_computed_tokens",
                          "Embedding tokens computed (padding included)", ["model"])

# Requests on the realtime lane, as the worker sees them. Times are measured from the
# request's enqueue time (wall clock of the API that sent it).
QUEUE_SECONDS = Histogram("inferq_queue_seconds",
                          "Realtime: enqueued until admitted to the engine; batch: shard "
                          "dispatched until claimed", ["lane", "model"],
                          buckets=LATENCY_BUCKETS)
TTFT = Histogram("inferq_time_to_first_token_seconds",
                 "Enqueued until the first generated text of a realtime stream",
                 ["lane", "model"], buckets=LATENCY_BUCKETS)
ITL = Histogram("inferq_inter_token_seconds",
                "Between consecutive text deltas of a realtime stream", ["lane", "model"],
                buckets=STEP_BUCKETS)
INFERENCE_SECONDS = Histogram("inferq_inference_seconds",
                              "Accelerator-seconds of one realtime request",
                              ["lane", "model", "kind"], buckets=LATENCY_BUCKETS)
ACCEL_SECONDS = Counter("inferq_accelerator_seconds",
                        "Accelerator-seconds charged to answered work", ["lane", "model"])
REQUESTS = Counter("inferq_worker_requests", "Realtime requests answered by this worker",
                   ["lane", "model", "kind", "outcome"])

# Shards and reliability.
SHARDS_IN_FLIGHT = Gauge("inferq_shards_in_flight", "Shards this worker is running",
                         ["lane"])
SHARDS = Counter("inferq_shards", "Shard runs ended on this worker, by outcome",
                 ["lane", "outcome"])
BATCH_ROWS = Counter("inferq_batch_rows", "Batch rows computed (ok and error lines)",
                     ["lane", "model", "result"])
RETRIES = Counter("inferq_retries", "Work sent again: shard runs retried or handed back, "
                  "Celery task retries", ["what"])
for _what in ("shard:retry", "shard:handed_back", f"task:{TASK_VALIDATE}", f"task:{TASK_SHARD}",
              f"task:{TASK_FINALIZE}"):
    RETRIES.labels(_what)  # present at 0 before the first retry
LEASES_LAPSED = Counter("inferq_leases_lapsed", "Shards the janitor handed back because "
                        "their lease lapsed")
SHARDS_GIVEN_UP = Counter("inferq_janitor_shards_failed", "Shards the janitor failed "
                          "after too many attempts without progress")
BATCHES_EXPIRED = Counter("inferq_janitor_batches_expired",
                          "Batches the janitor expired at their completion window")


MODEL_LOADS = Counter("inferq_model_loads", "Model versions loaded by this worker, by "
                      "reason (configured, placement: a cold start, warm_pool)",
                      ["model", "reason"])
MODEL_UNLOADS = Counter("inferq_model_unloads", "Model versions unloaded, by reason "
                        "(evicted, idle, command)", ["model", "reason"])
MODEL_LOAD_SECONDS = Histogram("inferq_model_load_seconds", "Time to load a model version",
                               ["model"], buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))


def lane_of(priority: int) -> str:
    return LANES[priority] if 0 <= priority < len(LANES) else str(priority)


def batch_recorder(model: str) -> Callable[[int, int, int, float], None]:
    """The embedding engine's ``on_batch`` callback for ``model``."""
    seconds, rows = STEP_SECONDS.labels("embeddings", model), STEP_ROWS.labels("embeddings",
                                                                                 model)
    tokens, padding = STEP_TOKENS.labels(model), PADDING.labels(model)
    real_c, computed_c = REAL_TOKENS.labels(model), COMPUTED_TOKENS.labels(model)

    def record(n: int, real: int, computed: int, dt: float) -> None:
        rows.observe(n)
        seconds.observe(dt)
        tokens.observe(computed)
        padding.observe(real / computed if computed else 1.0)
        real_c.inc(real)
        computed_c.inc(computed)

    return record


def step_recorder(model: str) -> Callable[[int, float], None]:
    """The generation engine's ``on_step`` callback for ``model``."""
    seconds, rows = STEP_SECONDS.labels("generation", model), STEP_ROWS.labels("generation",
                                                                                 model)

    def record(n: int, dt: float) -> None:
        rows.observe(n)
        seconds.observe(dt)

    return record


def observe_request(lane: str, model: str, kind: str, outcome: str,
                    seconds: float | None) -> None:
    """One realtime request answered (``outcome`` ok or error), with its accelerator time."""
    REQUESTS.labels(lane, model, kind, outcome).inc()
    if seconds is not None:
        INFERENCE_SECONDS.labels(lane, model, kind).observe(seconds)
        ACCEL_SECONDS.labels(lane, model).inc(seconds)


# The per-minute history of queue time and time to first token (jobs/slo/stats.py), written
# to Redis by the flusher thread ``history_flusher`` makes.
HISTORY = stats.Recorder()


def history_flusher(r: Redis) -> stats.Flusher:
    return stats.Flusher(HISTORY, r)


def observe_queue(lane: str, model: str, seconds: float) -> None:
    QUEUE_SECONDS.labels(lane, model).observe(max(0.0, seconds))
    HISTORY.observe(stats.QUEUE, lane, model, seconds)


class StreamTimer:
    """Time to first token and inter-token latency of one stream (engine thread)."""

    def __init__(self, lane: str, model: str, enqueued_at: float | None,
                 clock: Callable[[], float]) -> None:
        self.lane, self.model, self.enqueued_at, self.clock = lane, model, enqueued_at, clock
        self.last: float | None = None

    def delta(self) -> None:
        now = self.clock()
        if self.last is None:
            if self.enqueued_at is not None:
                ttft = max(0.0, now - self.enqueued_at)
                TTFT.labels(self.lane, self.model).observe(ttft)
                HISTORY.observe(stats.TTFT, self.lane, self.model, ttft)
        else:
            ITL.labels(self.lane, self.model).observe(now - self.last)
        self.last = now


def record_sweep(requeued: int, failed: int, expired: int) -> None:
    """What one janitor sweep repaired."""
    LEASES_LAPSED.inc(requeued)
    SHARDS_GIVEN_UP.inc(failed)
    BATCHES_EXPIRED.inc(expired)


# Scrape-time series ------------------------------------------------------------------------

class RuntimeCollector(Collector):
    """Series read from the worker's runtime when scraped: breaker state, engine rows and
    tokens by lane, and the accelerator's utilization and memory when there is one."""

    def __init__(self, rt: WorkerRuntime) -> None:
        self.rt = rt

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only (no name clash checks at register)

    def collect(self) -> Iterator[Any]:
        rt = self.rt
        state = StateSetMetricFamily("inferq_breaker_state", "The worker's circuit breaker",
                                     labels=["worker"])
        now = rt.breaker.state
        state.add_metric([rt.name], {s.value: s == now for s in BreakerState})
        yield state
        rows = CounterMetricFamily("inferq_engine_rows", "Rows embedded by the engine, by "
                                   "lane", labels=["engine", "model", "version", "lane"])
        tokens = CounterMetricFamily("inferq_generation_tokens", "Tokens generated, by lane",
                                     labels=["model", "version", "lane"])
        load = GaugeMetricFamily("inferq_engine_sequences", "Generation sequences running "
                                 "and waiting in the engine",
                                 labels=["model", "version", "state"])
        prompt = CounterMetricFamily("inferq_prompt_tokens", "Prompt tokens of generation "
                                     "prefills, computed or taken from the prefix cache",
                                     labels=["model", "version", "source"])
        pending = GaugeMetricFamily("inferq_engine_pending_rows", "Embedding rows waiting "
                                    "for a micro-batch", labels=["model", "version"])
        resident = GaugeMetricFamily("inferq_model_resident_bytes", "Model versions this "
                                     "worker holds (their files' bytes)",
                                     labels=["model", "version"])
        served = CounterMetricFamily("inferq_model_served", "Requests and batch rows looked "
                                     "up on each resident version", labels=["model", "version"])
        for res in rt.residency.residents():
            name, version = res.model.name, res.model.version
            resident.add_metric([name, version], res.bytes)
            served.add_metric([name, version], res.served)
            if res.engine is not None:
                for prio, n in sorted(res.engine.stats.by_priority.items()):
                    rows.add_metric(["embeddings", name, version, lane_of(prio)], n)
                pending.add_metric([name, version], res.engine.pending())
            gen = res.generation
            if gen is not None:
                for prio, n in sorted(gen.stats.tokens_by_priority.items()):
                    tokens.add_metric([name, version, lane_of(prio)], n)
                prompt.add_metric([name, version, "computed"], gen.stats.prefill_tokens)
                prompt.add_metric([name, version, "cached"], gen.stats.cached_tokens)
                running, waiting = gen.load()
                load.add_metric([name, version, "running"], running)
                load.add_metric([name, version, "waiting"], waiting)
        yield from (rows, tokens, load, prompt, pending, resident, served)
        yield from accelerator_metrics()


def accelerator_metrics() -> Iterator[Any]:
    """Utilization (NVML, when pynvml is installed) and memory (torch) of each CUDA
    device; nothing at all without one."""
    import sys

    torch = sys.modules.get("torch")  # only a worker that loaded a model has it
    if torch is None or not torch.cuda.is_available():
        return
    n = torch.cuda.device_count()
    used = GaugeMetricFamily("inferq_accelerator_memory_used_bytes",
                             "Accelerator memory in use (device-wide)", labels=["device"])
    total = GaugeMetricFamily("inferq_accelerator_memory_total_bytes",
                              "Accelerator memory of the device", labels=["device"])
    alloc = GaugeMetricFamily("inferq_accelerator_memory_allocated_bytes",
                              "Accelerator memory allocated by this process's tensors",
                              labels=["device"])
    for i in range(n):
        free, size = torch.cuda.mem_get_info(i)
        used.add_metric([str(i)], size - free)
        total.add_metric([str(i)], size)
        alloc.add_metric([str(i)], torch.cuda.memory_allocated(i))
    yield from (used, total, alloc)
    util = _nvml_utilization(n)
    if util:
        g = GaugeMetricFamily("inferq_accelerator_utilization_ratio",
                              "Share of the last sample period the device was busy (NVML)",
                              labels=["device"])
        for i, u in util.items():
            g.add_metric([str(i)], u / 100)
        yield g


def _nvml_utilization(n: int) -> dict[int, float]:
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        return {i: float(pynvml.nvmlDeviceGetUtilizationRates(
            pynvml.nvmlDeviceGetHandleByIndex(i)).gpu) for i in range(n)}
    except Exception as e:  # noqa: BLE001 - no NVML (driver, container): no series
        log.debug("NVML: %s", e)
        return {}


# The HTTP server ---------------------------------------------------------------------------

_served: dict[str, str] = {}
_lock = threading.Lock()


# A fixed port still held by the process this one replaces (a pool child that outlives
# its killed parent for a moment) is tried again, every RETRY_S for up to HOLD_S.
RETRY_S, HOLD_S = 0.5, 120.0


def serve(host: str, port: int) -> str | None:
    """Start this process's metrics server once (``port`` 0: a free one); its URL. A fixed
    ``port`` in use is taken in the background once it is free (None meanwhile: ``url``
    says when); any other failure raises OSError."""
    with _lock:
        if "url" in _served or "waiting" in _served:
            return _served.get("url")
        try:
            return _bind(host, port)
        except OSError as e:
            if port == 0 or e.errno != errno.EADDRINUSE:
                raise
            _served["waiting"] = str(port)
    log.warning("metrics port %s:%s is in use; taking it once it is free", host, port)
    threading.Thread(target=_bind_when_free, args=(host, port), daemon=True,
                     name="metrics-port").start()
    return None


def _bind(host: str, port: int) -> str:
    server, _ = start_http_server(port, addr=host)
    bound = server.server_address[1]
    shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    if ":" in shown:
        shown = f"[{shown}]"
    _served["url"] = f"http://{shown}:{bound}/metrics"
    log.info("metrics at %s", _served["url"])
    return _served["url"]


def _bind_when_free(host: str, port: int) -> None:
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        time.sleep(RETRY_S)
        try:
            with _lock:
                _bind(host, port)
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                break
    log.error("metrics server on %s:%s did not start: the port stayed in use", host, port)


def url() -> str | None:
    """This process's metrics URL, once ``serve`` started it."""
    return _served.get("url")


def register_runtime(rt: WorkerRuntime) -> None:
    REGISTRY.register(RuntimeCollector(rt))
