"""What every engine of a worker shares: a thread of its own runs its loop and sleeps on
one condition until there is work, and ``stop`` ends it. The generation engines also
share their queue: requests wait in a heap by (priority, order), realtime (0) first,
then in the order they came.

Realtime work is shared among projects (its request's ``project``): the next realtime
sequence admitted is the oldest of the project holding the fewest engine rows
(``fair_index``), and when the rows are full a project below its share of them
(``share``: the realtime rows divided among the projects with realtime work) takes a
row from the project furthest above its share (``over_share``); on an engine that
cannot take a row back (vLLM), the last rows (past ``ceiling``) are kept for projects
holding none, whatever holds the others (batch work included). So
a project's request of many choices (n x max_tokens) cannot hold every row while
another's request waits."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from jobs.core import lanes
from workers.engines.fanout import Scored, sequences

if TYPE_CHECKING:  # annotations only
    from workers.engines.request import GenRequest
    from workers.engines.sinks import Sink

# The engines' priorities of the model lanes (jobs.core.lanes.PRIORITY), by name: lower
# is served first.
REALTIME, JOBS, BATCH, FLEX = (lanes.PRIORITY[lane] for lane in lanes.MODEL_LANES)


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

    @property
    def req(self) -> GenRequest: ...


def project_of(q: Queued) -> str:
    """The project a sequence's request is billed to ("" for none)."""
    return q.req.project


def fair_index(waiting: list[tuple[int, int, Q]], held: Counter[str]) -> int:
    """The index in the heap ``waiting`` of the sequence to admit next: its head, unless
    the head is realtime: then, of the realtime sequences, the oldest of the project
    holding the fewest rows (``held``, by project: running or admitted this step)."""
    if not waiting or waiting[0][0] != 0:
        return 0
    best, key = 0, (held[project_of(waiting[0][2])], waiting[0][1])
    for i, (prio, order, q) in enumerate(waiting):
        if prio == REALTIME and (k := (held[project_of(q)], order)) < key:
            best, key = i, k
    return best


def take(waiting: list[tuple[int, int, Q]], i: int) -> Q:
    """Remove and return the sequence at index ``i`` of the heap ``waiting``."""
    if i == 0:
        return heapq.heappop(waiting)[2]
    item = waiting[i]
    waiting[i] = waiting[-1]
    waiting.pop()
    heapq.heapify(waiting)
    return item[2]


def projects_waiting(waiting: Iterable[tuple[int, int, Q]]) -> set[str]:
    """The projects with realtime sequences waiting."""
    return {project_of(q) for prio, _, q in waiting if prio == REALTIME}


def share(rows: int, held: Counter[str], waiting: set[str]) -> int:
    """A project's share of ``rows`` realtime rows: divided among the projects holding
    some (``held``) or waiting for some (``waiting``); at least one."""
    active = {p for p, n in held.items() if n > 0} | waiting
    return max(1, rows // max(1, len(active)))


def ceiling(rows: int) -> int:
    """On an engine that cannot free a row for another project's (vLLM): the rows in use
    beyond which only a project holding none takes one: all but a reserve of an eighth
    (at least one)."""
    return max(1, rows - max(1, rows // 8))


def over_share(project: str, rows: int, held: Counter[str], waiting: set[str]) -> str | None:
    """When the rows are full and ``project`` waits: the project whose row it takes (the
    one holding the most, above its share), or None when ``project`` already holds its
    share or nobody is above theirs."""
    fair = share(rows, held, waiting | {project})
    if held[project] >= fair:
        return None
    top = max((p for p in held if p != project), key=lambda p: held[p], default=None)
    return top if top is not None and held[top] > fair else None


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
