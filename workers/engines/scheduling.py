"""What every engine of a worker shares: a thread of its own runs its loop and sleeps on
one condition until there is work, and ``stop`` ends it. The generation engines also
share their queue: requests wait in a heap by (priority, order), realtime (0) first,
then in the order they came."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from workers.engines.fanout import Scored, sequences

if TYPE_CHECKING:  # annotations only
    from workers.engines.request import GenRequest
    from workers.engines.sinks import Sink


class Scheduled:
    """An engine's loop thread, the condition it sleeps on and the order its work came
    in (``_order``). Subclasses say when there is work (``_has_work``)."""

    stop_s: float = 10.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._order = itertools.count()
        self._stop = False
        self._thread: threading.Thread | None = None

    def _start_loop(self, loop: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=loop, name=name, daemon=True)
        self._thread.start()

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _await_work(self) -> bool:
        """Under the lock: sleep until there is work; False once the engine stops."""
        while not self._stop and not self._has_work():
            self._cond.wait()
        return not self._stop

    def stop(self) -> None:
        """Stop the loop; what it was given and did not finish fails ("the engine
        stopped", the loop's last act). Waits ``stop_s`` for the thread at most."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=self.stop_s)


class Queued(Scored, Protocol):
    """A sequence as the queue orders it (and ``best_of`` ranks it)."""

    priority: int
    order: int


Q = TypeVar("Q", bound=Queued)


class PriorityQueued(Scheduled, Generic[Q]):
    """A generation engine's waiting queue: one entry per sequence a request runs as
    (several for a request that fans out), made by ``_new``."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting: list[tuple[int, int, Q]] = []

    def submit(self, req: GenRequest, sink: Sink, priority: int) -> None:
        """Queue ``req``; a request that fans out (``req.fans()``) needs a ChoiceSink.
        Its sequences are queued together: admitted in one step where they fit."""
        self._enqueue(*sequences(req, sink, lambda s, seed: self._new(req, s, priority, seed)))

    def _new(self, req: GenRequest, sink: Sink, priority: int, seed: int | None) -> Q:
        raise NotImplementedError

    def _enqueue(self, *items: Q) -> None:
        with self._cond:
            for q in items:
                heapq.heappush(self._waiting, (q.priority, q.order, q))
            self._cond.notify()
