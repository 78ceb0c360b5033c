"""The worker's Celery app, built from Settings, and the signal handlers of its processes.

Start with ``inferq worker --lanes realtime,jobs,batch``. A pool child that serves a
model lane builds its ``WorkerRuntime`` once (``worker_process_init``): the models,
the engine threads, the realtime and jobs consumers (if those lanes are served) and
the heartbeat, kept for its whole life; its main process takes shards only from then
on (``ShardQueuesAfterModels``). A pool child that serves the control lane
runs the janitor and the webhook deliveries.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.signals import (
    setup_logging,
    task_retry,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)

from jobs.core import logs, tracing
from jobs.core.context import Context
from jobs.core.dispatch import make_celery
from jobs.core.lanes import CONTROL, MODEL_LANES
from jobs.core.settings import Settings
from workers.lanes.batch import ShardConsumers
from workers.lanes.control import DeliveryThread, JanitorThread
from workers.process import metrics
from workers.process.heartbeat import Heartbeat, worker_name

if TYPE_CHECKING:  # torch is imported only by a pool child that serves a model lane
    from workers.process.runtime import WorkerRuntime

settings = Settings.from_env()
app = make_celery(settings)
app.conf.imports = ("workers.celery.tasks",)


class PoolProcess:
    """What this process has built, on first use: its Context, and in a pool child that
    serves a model lane its WorkerRuntime. Tasks take them from here and pass them on."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.shard_consumers = ShardConsumers(app, settings.lane_set)
        self.janitor: JanitorThread | None = None
        self.deliveries: DeliveryThread | None = None
        self.heartbeat: Heartbeat | None = None
        self._ctx: Context | None = None
        self._runtime: WorkerRuntime | None = None
        self._lock = threading.Lock()

    def context(self) -> Context:
        if self._ctx is None:
            self._ctx = Context(self.settings)
        return self._ctx

    def runtime(self) -> WorkerRuntime:
        """The models, engines and lanes; built on the first call, in the pool child."""
        with self._lock:
            if self._runtime is None:
                from workers.process.runtime import build_runtime

                self._runtime = build_runtime(self.settings, self.context(),
                                              on_breaker_open=self.shard_consumers.pause,
                                              on_residency=self._residency_changed,
                                              draining=draining)
            return self._runtime

    def _residency_changed(self) -> None:
        """The pool child loaded or unloaded a version: the main process's shard queues
        follow (once the runtime is built: its first announcement is the ready flag)."""
        rt = self._runtime
        if rt is not None:
            self.shard_consumers.refs = rt.resident()
            announce_ready(rt.resident())

    def start_janitor(self) -> None:
        self.janitor = JanitorThread(self.context(), self.settings.janitor_interval_s)
        self.janitor.start()
        self.deliveries = DeliveryThread(self.context())
        self.deliveries.start()
        if not self.settings.lane_set.intersection(MODEL_LANES):
            # A control-only process announces itself too (its metrics URL); the model
            # lanes' heartbeat (workers/process/runtime.py) does it in a model worker.
            name = worker_name()
            self.heartbeat = Heartbeat(self.context().redis, name, lambda: {
                "name": name, "lanes": [CONTROL], "models": [],
                "metrics_url": metrics.url()}, self.settings.worker_heartbeat_s)
            self.heartbeat.start()

    def shutdown(self) -> None:
        if self.janitor is not None:
            self.janitor.stopping.set()
        if self.deliveries is not None:
            self.deliveries.stopping.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self._runtime is not None:
            self._runtime.stop()


process = PoolProcess(settings)


def _json_logging(**_: Any) -> None:
    logs.setup(settings)


if settings.log_format == "json":  # Celery leaves logging to a receiver of this signal
    setup_logging.connect(_json_logging, weak=False)


def _drain_flag(main_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"inferq-drain-{main_pid}"


def _ready_flag(main_pid: int) -> Path:
    """Written by the main process's pool child once its models are loaded, and again
    whenever the versions it holds change: its pid and those versions (JSON)."""
    return Path(tempfile.gettempdir()) / f"inferq-ready-{main_pid}"


def announce_ready(refs: list[str]) -> None:
    """Pool child: tell the main process which versions it holds (so which shard queues
    to consume); written whole and renamed, never read half-written."""
    flag = _ready_flag(os.getppid())
    tmp = flag.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "refs": sorted(refs)}))
    tmp.replace(flag)


def _ready_child() -> tuple[int, tuple[str, ...]] | None:
    """This main process's pool child that has its models loaded, if it still runs, and
    the versions it holds."""
    try:
        got = json.loads(_ready_flag(os.getpid()).read_text())
        pid = int(got["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid, tuple(str(r) for r in got.get("refs", []))


class ShardQueuesAfterModels(bootsteps.StartStopStep):
    """Main process of a model worker: consume the shard queues only while its pool
    child has its models loaded, and only those of the versions it holds.

    Shards are sent to one queue per lane and model version (``jobs.core.dispatch.shard_queue``).
    Celery's consumer starts before the pool child's ``worker_process_init`` ends and
    would reserve a shard during the (re)load, which no other worker could then take;
    this cancels the shard queues at start and adds those of the child's versions when
    the child announces itself (``_ready_flag``), again after a pool child that died
    (out of memory) is replaced, and whenever the child loads or unloads a version.
    Only those transitions touch the queues, so a breaker's pause
    (``ShardConsumers.pause``) is left as it is."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.consuming: set[str] = set()
        self.tick: Any = None

    def start(self, c: Any) -> None:
        ready = _ready_child()
        self.consuming = set()
        for q in process.shard_consumers.queues:  # the plain lane queues, given by -Q
            c.cancel_task_queue(q)
        if ready is not None:  # a reconnect while the child runs: consume again
            self._apply(c, ready)
        self.tick = c.timer.call_repeatedly(0.5, self._check, (c,))

    def stop(self, c: Any) -> None:
        if self.tick is not None:
            self.tick.cancel()

    def _check(self, c: Any) -> None:
        self._apply(c, _ready_child())

    def _apply(self, c: Any, ready: tuple[int, tuple[str, ...]] | None) -> None:
        want = set() if ready is None else set(
            process.shard_consumers.queues_for(list(ready[1])))
        for q in sorted(self.consuming - want):
            c.cancel_task_queue(q)
        for q in sorted(want - self.consuming):
            c.add_task_queue(q)
        self.consuming = want


if settings.lane_set.intersection(MODEL_LANES) and process.shard_consumers.queues:
    app.steps["consumer"].add(ShardQueuesAfterModels)

# The exit status of a worker that cannot load the models it was configured to hold
# (sysexits' EX_CONFIG): restarting it with the same settings would not help.
EX_CONFIG = 78


def _unservable_flag(main_pid: int) -> Path:
    """Written by the main process's pool child when the models it was configured with
    could not be loaded: why (text)."""
    return Path(tempfile.gettempdir()) / f"inferq-unservable-{main_pid}"


class ExitWhenUnservable(bootsteps.StartStopStep):
    """Main process of a model worker: when its pool child could not load the models
    the worker was configured with, the worker exits with status ``EX_CONFIG`` and
    the reason in its log, instead of living on without ever serving (its heartbeat
    would never start: the API would count no worker while the process looks alive,
    and no orchestrator would restart it)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.tick: Any = None

    def start(self, c: Any) -> None:
        self.tick = c.timer.call_repeatedly(0.5, self._check, ())

    def stop(self, c: Any) -> None:
        if self.tick is not None:
            self.tick.cancel()

    def _check(self) -> None:
        from celery.worker import state

        flag = _unservable_flag(os.getpid())
        try:
            why = flag.read_text()
        except OSError:
            return
        if not state.should_stop:
            logging.getLogger("inferq.worker").critical(
                "this worker cannot serve what it was configured for, exiting (status %d): %s",
                EX_CONFIG, why)
            state.should_stop = EX_CONFIG  # the worker's exit status


if settings.lane_set.intersection(MODEL_LANES):
    app.steps["consumer"].add(ExitWhenUnservable)


def draining() -> bool:
    """True once this worker is shutting down (SIGTERM: a spot notice or a deploy).

    ``worker_shutting_down`` fires in the main process only; the flag file is how
    the pool child, between chunks, learns that it should commit and hand back."""
    return _drain_flag(os.getppid()).exists()


@worker_init.connect
def _init_main(**_: Any) -> None:
    _drain_flag(os.getpid()).unlink(missing_ok=True)
    _ready_flag(os.getpid()).unlink(missing_ok=True)
    _unservable_flag(os.getpid()).unlink(missing_ok=True)


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
    logs.setup(settings)  # after the fork: this process's log format and its tracer
    tracing.setup(settings, "worker" if settings.lane_set.intersection(MODEL_LANES)
                  else CONTROL)
    try:  # after the fork: each pool process serves its own metrics
        metrics.serve(settings.worker_metrics_host, settings.worker_metrics_port)
    except OSError as e:
        logging.getLogger("inferq.metrics").error(
            "metrics server on %s:%s did not start: %s", settings.worker_metrics_host,
            settings.worker_metrics_port, e)
    if settings.lane_set.intersection(MODEL_LANES):
        from workers.process.runtime import CannotServe

        try:
            rt = process.runtime()
        except CannotServe as e:
            logging.getLogger("inferq.worker").critical("%s", e)
            flag = _unservable_flag(os.getppid())
            flag.with_suffix(".tmp").write_text(str(e))
            flag.with_suffix(".tmp").replace(flag)
            os._exit(EX_CONFIG)  # the main process exits with it (ExitWhenUnservable)
        announce_ready(rt.resident())  # now take shards
    if CONTROL in settings.lane_set:
        process.start_janitor()


@task_retry.connect
def _retried(sender: Any = None, **_: Any) -> None:
    metrics.RETRIES.labels(f"task:{getattr(sender, 'name', 'unknown')}").inc()


@worker_process_shutdown.connect
def _shutdown_child(**_: Any) -> None:
    process.shutdown()
    tracing.shutdown()  # the last spans are exported
