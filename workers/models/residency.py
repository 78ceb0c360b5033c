"""The model versions a worker process holds: loaded within a memory budget, looked up
by the lanes for each request, loaded and unloaded on command, reported in the
heartbeat.

A resident version is ``name@version`` with its engine: an embedding engine over its
model, or a generation engine (a chat model the worker is configured with is loaded
on its first request, unless ``INFERQ_PRELOAD_CHAT_MODEL``; one placed on it is loaded
at once). Its size is
the bytes of its files (the registry's manifest), what the budget
(``INFERQ_MODEL_MEMORY_MB``, 0: no limit) is counted in. Loading a version over the
budget first unloads the least recently used versions until it fits.

Commands come on the worker's own Redis list (``jobs.fleet.placement.command_list``), sent
by the placement (a request for a version no live worker holds) and the warm pools
(jobs.fleet.placement.reconcile): ``{"op": "load" | "unload", "ref": ..., "reason": ...}``.
Loads and unloads are counted by reason (``inferq_model_loads``), and each load is
recorded in Redis (``jobs.fleet.placement.record_load``) where ``inferq models list`` reads it.

A generation engine that broke (``broken``: vLLM's core died) is built again in the
background (``Resident.broke``); until it is, the version is not announced as held
(nothing is routed to it, its shard queue is not consumed) and its engine is not
reported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import redis

from jobs.batches import fairshare
from jobs.core import refs
from jobs.core.context import Context
from jobs.core.errors import ModelNotLoaded
from jobs.core.schema import Model
from jobs.fleet import placement, registry
from workers.process import metrics

if TYPE_CHECKING:  # torch-bound
    from workers.engines.embeddings import EmbeddingEngine
    from workers.engines.interface import Engine
    from workers.models.embedding_inputs import EmbeddingInputs

log = logging.getLogger("inferq.residency")


@dataclass
class Resident:
    """One model version held by this worker, with its engine."""

    model: Model
    bytes: int
    inputs: EmbeddingInputs | None = None  # embeddings: the model (tokenizer and passes)
    engine: EmbeddingEngine | None = None
    chat: Callable[[], Engine] | None = None  # chat: its engine, built on first use
    generation: Engine | None = None
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    served: int = 0
    reason: str = "configured"
    lock: threading.Lock = field(default_factory=threading.Lock)
    rebuilding: bool = False  # its engine broke and is being built again
    stopped: bool = False
    on_change: Callable[[], None] | None = None  # what it serves changed (its Residency)

    @property
    def ref(self) -> str:
        return refs.model_ref(self.model.name, self.model.version)

    def generator(self) -> Engine:
        """Its generation engine: built on first use, and again in place of one that
        broke."""
        assert self.chat is not None
        with self.lock:
            gen = self.generation
            if gen is not None and getattr(gen, "broken", None) is not None:
                self.generation = None
                gen.stop()
            if self.generation is None:
                self.generation = self.chat()
                if self.stopped:  # unloaded while it was being built
                    self.generation.stop()
            return self.generation

    @property
    def ready(self) -> bool:
        """Whether it serves: not a broken engine, nor one being built again."""
        gen = self.generation
        return not self.rebuilding and (gen is None or getattr(gen, "broken", None) is None)

    def broke(self, e: BaseException) -> None:
        """Its engine broke (its engine's thread tells): announced as not held, then
        built again in the background; a rebuild that fails leaves it not held, and
        the next request for it tries again."""
        self.rebuilding = True
        self._changed()
        threading.Thread(target=self._rebuild, args=(e,), name="inferq-rebuild",
                         daemon=True).start()

    def _rebuild(self, e: BaseException) -> None:
        t0 = time.perf_counter()
        try:
            self.generator()
            log.info("%s: its engine, broken (%s: %s), built again in %.1f s", self.ref,
                     type(e).__name__, e, time.perf_counter() - t0)
        except Exception:  # noqa: BLE001 - the worker keeps serving its other versions
            log.exception("%s: building its broken engine again failed", self.ref)
            return
        finally:
            self.rebuilding = False
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # noqa: BLE001 - announced at the next heartbeat instead
                log.exception("announcing %s", self.ref)

    def busy(self) -> int:
        """Work waiting in or running on this version's engine."""
        if self.engine is not None:
            return self.engine.pending()
        gen = self.generation
        return sum(gen.load()) if gen is not None else 0

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until the work already on this version's engine is done (no new work
        reaches it once it is unloaded); False if some is left after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.busy():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def stop(self) -> None:
        self.stopped = True
        if self.engine is not None:
            self.engine.stop()
        if self.generation is not None:
            self.generation.stop()


# Builds a Resident for a registry row (loads the weights); the worker runtime's.
Loader = Callable[[Model], Resident]


class Residency:
    """The versions this worker process holds, least recently used first."""

    def __init__(self, ctx: Context, loader: Loader, budget_bytes: int = 0,
                 worker: str = "", on_change: Callable[[], None] | None = None) -> None:
        self.ctx, self.loader, self.budget = ctx, loader, budget_bytes
        self.worker = worker
        self.on_change = on_change
        self._held: dict[str, Resident] = {}
        self._loading: set[str] = set()
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()  # one load at a time
        self.loads: dict[str, int] = {}  # by reason
        self.unloads: dict[str, int] = {}

    # Lookups (the lanes) -------------------------------------------------------------

    def find(self, name: str, version: str | None = None) -> Resident:
        """The resident version for a request: ``name@version``, or for a bare name the
        one this worker holds (the newest, if it holds several); ModelNotLoaded else."""
        with self._lock:
            if version is not None:
                res = self._held.get(refs.model_ref(name, version))
            else:
                held = [r for r in self._held.values() if r.model.name == name]
                res = max(held, key=lambda r: (r.model.is_default,
                                               registry.version_key(r.model.version)),
                          default=None)
            if res is None:
                raise ModelNotLoaded(name)
            res.last_used = time.time()
            res.served += 1
            return res

    def embedder(self, name: str, version: str | None = None) -> Resident:
        res = self.find(name, version)
        if res.engine is None:
            raise ModelNotLoaded(name)
        return res

    def chat(self, name: str, version: str | None = None) -> Engine:
        res = self.find(name, version)
        if res.chat is None:
            raise ModelNotLoaded(name)
        return res.generator()

    def refs(self) -> list[str]:
        """The versions it serves now (not one whose engine is being built again)."""
        with self._lock:
            return [ref for ref, r in self._held.items() if r.ready]

    def residents(self) -> list[Resident]:
        with self._lock:
            return list(self._held.values())

    def names(self) -> list[str]:
        return sorted({r.model.name for r in self.residents()})

    def busy_refs(self, priority: int) -> set[str]:
        """The embedding versions whose engine is running a pass of ``priority`` or has
        rows of it waiting: a request of that priority taken for one of them now would
        wait behind that work (work of lower priority it overtakes at the next pass)."""
        return {r.ref for r in self.residents()
                if r.engine is not None and not r.engine.free_for(priority)}

    def wait_free(self, priority: int, timeout: float) -> None:
        """Block until an embedding version that is busy with work of ``priority`` is
        free of it, or ``timeout`` seconds."""
        busy = [r for r in self.residents()
                if r.engine is not None and not r.engine.free_for(priority)]
        if busy:
            assert busy[0].engine is not None
            busy[0].engine.wait_free(priority, timeout)
        else:
            time.sleep(min(timeout, 0.001))

    def embedding_queue_refs(self, name_or_ref: str) -> list[Resident]:
        """The embedding versions a request on the queue of ``name_or_ref`` (a version,
        or a name: any of its versions) is served by."""
        return [r for r in self.residents() if r.engine is not None
                and name_or_ref in (r.ref, r.model.name)]

    def gathering(self, residents: list[Resident]) -> ExitStack:
        """Hold these versions' engines' next pass until the block ends (rows taken
        together run in one pass)."""
        stack = ExitStack()
        for r in residents:
            assert r.engine is not None
            stack.enter_context(r.engine.gathering())
        return stack

    def pending(self, priority: int | None = None) -> int:
        """Embedding rows waiting in this worker's engines (at ``priority``, if given)."""
        return sum(r.engine.pending(priority) for r in self.residents()
                   if r.engine is not None)

    def used_bytes(self) -> int:
        return sum(r.bytes for r in self.residents())

    # Loads and unloads ----------------------------------------------------------------

    def load(self, model_ref: str, reason: str) -> Resident:
        """Hold ``model_ref`` (a no-op if held), first unloading the least recently used
        versions until it fits the budget. ValueError for an unknown version or one
        larger than the whole budget."""
        name, version = refs.split_ref(model_ref)
        with self._load_lock:
            with self._lock:
                if model_ref in self._held:
                    return self._held[model_ref]
            m = (registry.get(self.ctx, name, version) if version
                 else registry.get_default(self.ctx, name))
            if m is None:
                raise ValueError(f"no registered model version {model_ref!r}")
            size = registry.total_bytes(m)
            if self.budget and size > self.budget:
                raise ValueError(f"{model_ref} ({size >> 20} MiB) is larger than this "
                                 f"worker's model memory ({self.budget >> 20} MiB)")
            self._make_room(size, keep=refs.model_ref(m.name, m.version))
            with self._lock:
                self._loading.add(model_ref)
            t0 = time.perf_counter()
            try:
                res = self.loader(m)
                if res.chat is not None and reason != "configured":
                    res.generator()  # placed: its weights now, not at its first request
            finally:
                with self._lock:
                    self._loading.discard(model_ref)
            self.hold(res, reason)
        metrics.MODEL_LOADS.labels(res.ref, reason).inc()
        metrics.MODEL_LOAD_SECONDS.labels(res.ref).observe(time.perf_counter() - t0)
        placement.record_load(self.ctx.redis, self.worker, res.ref, reason,
                              time.perf_counter() - t0)
        log.info("loaded %s (%s, %.1f s, %d MiB resident)", res.ref, reason,
                 time.perf_counter() - t0, self.used_bytes() >> 20)
        self._changed()
        return res

    def hold(self, res: Resident, reason: str) -> None:
        """Add a loaded version (``load`` does, after its loader)."""
        res.reason = reason
        res.on_change = self._changed
        with self._lock:
            self._held[res.ref] = res
            self.loads[reason] = self.loads.get(reason, 0) + 1

    def unload(self, model_ref: str, reason: str) -> bool:
        with self._lock:
            res = self._held.pop(model_ref, None)
            if res is None:
                return False
            self.unloads[reason] = self.unloads.get(reason, 0) + 1
        metrics.MODEL_UNLOADS.labels(model_ref, reason).inc()
        self._changed()  # no new work for it from here on
        if not res.drain():
            log.warning("%s unloaded with work still on its engine", model_ref)
        res.stop()
        log.info("unloaded %s (%s)", model_ref, reason)
        return True

    def _make_room(self, size: int, keep: str) -> None:
        if not self.budget:
            return
        while True:
            with self._lock:
                lru = sorted((r for r in self._held.values() if r.ref != keep),
                             key=lambda r: r.last_used)
                if self.used_bytes() + size <= self.budget or not lru:
                    return
                victim = lru[0].ref
            self.unload(victim, "evicted")

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def snapshot(self) -> dict[str, Any]:
        """What the heartbeat reports: the budget, what is held (LRU order) and loading."""
        with self._lock:
            held = sorted(self._held.values(), key=lambda r: r.last_used)
            loading = sorted(self._loading)
        return {"budget_bytes": self.budget, "used_bytes": sum(r.bytes for r in held),
                "busy": sum(r.busy() for r in held), "loading": loading,
                "rebuilding": sorted(r.ref for r in held if not r.ready),
                "models": [{"ref": r.ref, "kind": r.model.kind, "bytes": r.bytes,
                            "loaded_at": r.loaded_at, "last_used": r.last_used,
                            "served": r.served, "reason": r.reason} for r in held],
                "loads": dict(self.loads), "unloads": dict(self.unloads)}

    def stop(self) -> None:
        for r in self.residents():
            r.stop()


class Commands(threading.Thread):
    """Takes load and unload commands from this worker's list and carries them out. A
    load that fails is reported (``jobs.fleet.placement.load_failed``) and ``on_failed(ref,
    error)`` answers the realtime requests waiting for it."""

    def __init__(self, ctx: Context, worker: str, residency: Residency,
                 on_failed: Callable[[str, Exception], None] | None = None) -> None:
        super().__init__(name="inferq-model-commands", daemon=True)
        self.ctx, self.r, self.residency, self.on_failed = ctx, ctx.redis, residency, on_failed
        self.key = placement.command_list(worker)
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                got = self.r.blpop([self.key], timeout=1)
            except redis.RedisError as e:
                log.warning("model commands: %s; retrying", e)
                time.sleep(1)
                continue
            if got is not None:
                self.execute(got[1])

    def execute(self, raw: bytes | str) -> None:
        try:
            cmd = orjson.loads(raw)
            op, ref, reason = cmd["op"], str(cmd["ref"]), str(cmd.get("reason", "command"))
        except (ValueError, KeyError, TypeError) as e:
            log.warning("model command %r refused: %s", raw, e)
            return
        try:
            if op == "load":
                self.residency.load(ref, reason)
            elif op == "unload":
                self.residency.unload(ref, reason)
            else:
                log.warning("model commands: unknown op %r", op)
        except Exception as e:  # noqa: BLE001 - the worker keeps serving what it holds
            log.warning("could not load %s: %s", ref, e)
            self.failed(ref, e)
        finally:
            placement.placed(self.r, ref, self.residency.worker)

    def failed(self, ref: str, e: Exception) -> None:
        try:
            placement.load_failed(self.ctx, ref, f"{type(e).__name__}: {e}")
            fairshare.load_failed(self.ctx, ref)
            if self.on_failed is not None:
                self.on_failed(ref, e)
        except Exception:  # noqa: BLE001 - what waits for it times out instead
            log.exception("could not report the failed load of %s", ref)
