"""The engine: one thread owns the model and runs micro-batches from all pending work.

Work arrives from any thread (shard pipelines, the realtime consumer) as items
with a priority; each step the engine takes the most urgent priority class,
plans micro-batches over everything pending in it (so items from concurrent
sources share a batch), and runs the one holding the oldest item.

A forward pass that raises is run again in halves, down to the rows that raise
alone: only they fail (``blame``), and the circuit breaker hears of a failure only
when the micro-batch computed nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from jobs.core.errors import InvalidRequest
from jobs.tenants.usage import split
from workers.engines.batching import BatchPolicy
from workers.engines.scheduling import Scheduled


class Model(Protocol):
    def embed(self, batch: list[list[int]]) -> np.ndarray: ...


class RowFuture(Future[np.ndarray]):
    """A row's vector, and ``seconds``: its share of the forward pass that computed it
    (the pass's time split among its rows by their real tokens), set before the result."""

    seconds: float = 0.0
    started_at: float | None = None  # wall clock when its pass started


@dataclass
class _Item:
    seq: int
    tokens: list[int]
    future: RowFuture


@dataclass
class EngineStats:
    batches: int = 0
    by_priority: dict[int, int] = field(default_factory=dict)  # batches per priority
    rows: int = 0
    real_tokens: int = 0
    computed_tokens: int = 0
    busy_s: float = 0.0
    oom_splits: int = 0
    fault_splits: int = 0  # passes that raised (not out of memory), run again in halves
    faults: int = 0  # rows that raised alone


def is_oom(e: BaseException) -> bool:
    """CUDA/MPS/CPU allocator failures (torch.OutOfMemoryError) and MemoryError."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"


class SplitCounts(Protocol):
    oom_splits: int
    fault_splits: int


def count_split(stats: SplitCounts, e: BaseException, rows: int) -> bool:
    """A pass over ``rows`` raised ``e``: it is run again in halves, or its row fails
    alone. Counted in ``stats``; whether it ran out of memory."""
    oom = is_oom(e)
    if oom:
        stats.oom_splits += 1
    elif rows > 1:
        stats.fault_splits += 1
    return oom


def too_large(tokens: int, e: BaseException) -> MemoryError:
    """The per-request error once a request ran out of memory on its own."""
    return MemoryError(f"this request ({tokens} tokens) does not fit in the accelerator's "
                       f"memory even alone: {e}")


def blame(what: str, e: Exception, witnessed: bool) -> Exception:
    """The error of a row whose computation raised alone (the rest of its pass run in
    halves without it): the request's (400: ``what`` cannot be computed) when the same
    work ``witnessed`` the model computing other rows, so the model works and the
    input is at fault; otherwise ``e`` itself, the server's (500)."""
    if not witnessed:
        return e
    return InvalidRequest(f"{what} could not be computed: {type(e).__name__}: {e}",
                          code="uncomputable_input")


class EmbeddingEngine(Scheduled):
    def __init__(self, model: Model, policy: BatchPolicy,
                 on_batch: Any = None, on_pass: Any = None) -> None:
        super().__init__()
        self.model = model
        self.policy = policy
        self.on_batch = on_batch  # callback(rows, real, computed, seconds) for metrics
        self.on_pass = on_pass  # callback(ok: bool) after each forward pass (circuit breaker)
        self.stats = EngineStats()
        self._pending: dict[int, list[_Item]] = {}
        self._running: int | None = None  # the priority of the pass running, if one is
        self._held = 0  # callers gathering the rows of one pass (``gathering``)
        self._start_loop(self._loop, "inferq-engine")

    def submit(self, token_lists: list[list[int]], priority: int) -> list[RowFuture]:
        """Queue rows; each future resolves to that row's vector (or its exception)."""
        items = [_Item(next(self._order), t, RowFuture()) for t in token_lists]
        with self._cond:
            self._pending.setdefault(priority, []).extend(items)
            self._cond.notify()
        return [it.future for it in items]

    def pending(self, priority: int | None = None) -> int:
        """Rows waiting for a pass (of ``priority`` only, if given)."""
        with self._cond:
            if priority is not None:
                return len(self._pending.get(priority, ()))
            return sum(len(v) for v in self._pending.values())

    def free_for(self, priority: int) -> bool:
        """No row of ``priority`` waits and no pass of it runs: a row of that priority
        submitted now runs in the next pass (work of lower priority waits for it)."""
        with self._cond:
            return self._running != priority and not self._pending.get(priority)

    def wait_free(self, priority: int, timeout: float) -> bool:
        """Block until ``free_for(priority)`` (or ``timeout`` seconds); whether it is."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._running != priority and not self._pending.get(priority),
                timeout)

    @contextmanager
    def gathering(self) -> Iterator[None]:
        """Rows submitted inside wait for the block to end before a pass starts, so that
        rows taken together run in one pass (a pass already running is not affected)."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify()

    def _has_work(self) -> bool:
        return not self._held and any(self._pending.values())

    def _next_batch(self) -> tuple[int, list[_Item]] | None:
        """Called by the engine loop each step, under the lock."""
        prio = min((p for p, v in self._pending.items() if v), default=None)
        if prio is None:
            return None
        items = self._pending[prio]
        plan = self.policy.plan([len(it.tokens) for it in items])
        oldest = min(range(len(items)), key=lambda i: items[i].seq)
        chosen = next(b for b in plan if oldest in b)
        taken = set(chosen)
        self._pending[prio] = [it for i, it in enumerate(items) if i not in taken]
        return prio, [items[i] for i in chosen]

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._await_work():
                    self._fail_pending(RuntimeError("the engine stopped"))
                    return
                nxt = self._next_batch()
                self._running = nxt[0] if nxt is not None else None
            if nxt is not None:
                try:
                    self._run(*nxt)
                finally:
                    with self._cond:
                        self._running = None
                        self._cond.notify_all()  # wait_free's callers

    def _fail_pending(self, err: Exception) -> None:
        for items in self._pending.values():
            for it in items:
                if it.future.set_running_or_notify_cancel():
                    it.future.set_exception(err)
        self._pending.clear()

    def _run(self, prio: int, items: list[_Item]) -> None:
        live = [it for it in items if it.future.set_running_or_notify_cancel()]
        if not live:
            return
        started = time.time()
        for it in live:
            it.future.started_at = started
        faults: list[tuple[_Item, Exception]] = []
        computed = self._forward(prio, live, faults)
        if faults and not computed and self.on_pass is not None:
            self.on_pass(False)  # before the rows fail: their callers then see the breaker
        for it, e in faults:
            it.future.set_exception(blame("this input's embedding", e, computed > 0))

    def _forward(self, prio: int, live: list[_Item], faults: list[tuple[_Item, Exception]]
                 ) -> int:
        """Run one micro-batch; the rows it computed. Out of memory splits it in halves,
        down to single rows; so does a pass that raises, and a row that raises alone
        goes to ``faults``."""
        batch = [it.tokens for it in live]
        t0 = time.perf_counter()
        try:
            out = self.model.embed(batch)
        except Exception as e:  # noqa: BLE001 - contained: the rows that raise alone fail
            return self._split(prio, live, e, faults)
        dt = time.perf_counter() - t0
        if len(out) != len(live):
            err = RuntimeError(f"model returned {len(out)} rows for {len(live)} inputs")
            for it in live:
                it.future.set_exception(err)
            return 0
        if self.on_pass is not None:
            self.on_pass(True)
        real = sum(len(b) for b in batch)
        computed = max(len(b) for b in batch) * len(batch)
        st = self.stats
        st.batches += 1
        st.rows += len(live)
        st.real_tokens += real
        st.computed_tokens += computed
        st.busy_s += dt
        st.by_priority[prio] = st.by_priority.get(prio, 0) + len(live)
        if self.on_batch is not None:
            self.on_batch(len(live), real, computed, dt)
        # Time of passes that ran out of memory is not charged: only the pass that
        # computed a row is, split by real tokens (padding is the batch's, not a row's).
        for it, vec, share in zip(live, out, split(dt, [len(b) for b in batch]), strict=True):
            it.future.seconds = share
            it.future.set_result(vec)
        return len(live)

    def _split(self, prio: int, live: list[_Item], e: Exception,
               faults: list[tuple[_Item, Exception]]) -> int:
        """The pass over ``live`` raised ``e``: run its halves apart; a single row fails
        (out of memory: too large, now; otherwise: in ``faults``). The rows computed."""
        oom = count_split(self.stats, e, len(live))
        if len(live) > 1:
            half = len(live) // 2
            return (self._forward(prio, live[:half], faults)
                    + self._forward(prio, live[half:], faults))
        if oom:
            live[0].future.set_exception(too_large(len(live[0].tokens), e))
        else:
            self.stats.faults += 1
            faults.append((live[0], e))
        return 0


def started_of(futures: Sequence[Future[Any]]) -> float | None:
    """When the first pass of a request's rows started (wall clock), if one did."""
    return min((t for f in futures if (t := getattr(f, "started_at", None)) is not None),
               default=None)


def seconds_of(futures: Sequence[Future[Any]]) -> float:
    """The accelerator-seconds of a request's rows (0 for futures of another kind)."""
    return sum(getattr(f, "seconds", 0.0) for f in futures)


def when_all_done(futures: Sequence[Future[Any]], callback: Callable[[], object]) -> None:
    """Call ``callback`` once, on the thread that completes the last of ``futures``."""
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        callback()

    for f in futures:
        f.add_done_callback(one_done)
