"""A batch's progress as numbered events (``GET /v1/batches/{id}/events``).

Nothing is written for these events: a position is read off the batch as it is.
Two things about a batch only ever grow:

- its *status rank*: every transition the lifecycle allows (``jobs.core.status.ALLOWED``)
  goes to a higher rank (validating 0, in_progress 1, cancelling 2, finalizing 3,
  every terminal status 4), so a batch reaches each status at most once, in rank
  order;
- its *done count*, ``completed + failed`` over its requests: shards' counts are
  only ever added to (by the fenced checkpoint, and by finalize for requests that
  never ran), and a batch's usage grows in the same UPDATEs.

So ``(rank, done)`` orders every state a batch passes through, and it is the event
id (``"<rank>-<done>"``). A client that resumes from an id is sent a ``status`` event
for every status of a higher rank the batch has reached since (the batch row keeps a
timestamp for each status it reached, so the path is known after the fact: even
``finalizing``, which finalize commits together with the terminal status), then a
``progress`` event when more requests are done. A status event carries the counts
current when it is sent: after a reconnect, the counts of the latest state.

Changes are seen by polling PostgreSQL: each API process reads every batch its
streams follow in one short read per interval (the batch rows by their keys and their
shards' sums by the ``(batch_id, index)`` index, :class:`Watcher`), each poll in a
read-only snapshot of its own (rows and sums as of one moment: what finalize commits
together is seen together), so an open stream holds no connection and costs no query. PostgreSQL
is where the counts and statuses are committed, so a poll can never see a change that
is later lost, or miss one: a notification channel (Redis pub/sub) would need a
publish at every checkpoint and every status change, a subscription per stream, and
this same read after every notification and on every (re)connect anyway.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from jobs.batches import queries as repo
from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, NotFound, shown
from jobs.core.schema import Batch, now
from jobs.core.status import TERMINAL, BatchStatus

RANK: dict[str, int] = {BatchStatus.VALIDATING: 0, BatchStatus.IN_PROGRESS: 1,
                        BatchStatus.CANCELLING: 2, BatchStatus.FINALIZING: 3,
                        **{s: 4 for s in TERMINAL}}
TERMINAL_RANK = 4

STATUS = "status"
PROGRESS = "progress"
_POSITION = re.compile(r"([0-4])-(0|[1-9][0-9]{0,11})")


@dataclass(frozen=True, order=True)
class Position:
    """Where a client is in a batch's events: the rank and done count of the last
    event it saw. Both only grow, so positions compare field by field."""

    rank: int
    done: int

    def __str__(self) -> str:
        return f"{self.rank}-{self.done}"


START = Position(-1, -1)  # nothing seen yet


def parse_position(text: str | None) -> Position:
    """A ``Last-Event-ID`` as the client sent it; none (or empty) is the start."""
    if not text:
        return START
    m = _POSITION.fullmatch(text.strip())
    if m is None:
        raise InvalidRequest(f"Last-Event-ID must be the id of an event of this stream "
                             f"(<rank>-<done>, e.g. 1-250), got {shown(text)}",
                             param="Last-Event-ID")
    return Position(int(m[1]), int(m[2]))


@dataclass(frozen=True)
class Snapshot:
    """A batch and its shards' sums, as one poll read them."""

    batch: Batch
    sums: repo.ShardSums

    @property
    def status(self) -> str:
        return self.batch.status

    @property
    def done(self) -> int:
        return self.sums.completed + self.sums.failed + self.batch.invalid

    @property
    def position(self) -> Position:
        return Position(RANK[self.status], self.done)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def reached(self) -> list[tuple[str, int]]:
        """Every status the batch has reached, in order, with the time it was reached."""
        b = self.batch
        steps = [(BatchStatus.VALIDATING, b.created_at),
                 (BatchStatus.IN_PROGRESS, b.in_progress_at),
                 (BatchStatus.CANCELLING, b.cancelling_at),
                 (BatchStatus.FINALIZING, b.finalizing_at)]
        rank = RANK[b.status]
        out = [(str(s), at) for s, at in steps if at is not None and RANK[s] < rank]
        return [*out, (b.status, _reached_at(b))]


def _reached_at(b: Batch) -> int:
    at = {BatchStatus.VALIDATING: b.created_at, BatchStatus.IN_PROGRESS: b.in_progress_at,
          BatchStatus.CANCELLING: b.cancelling_at, BatchStatus.FINALIZING: b.finalizing_at,
          BatchStatus.COMPLETED: b.completed_at, BatchStatus.FAILED: b.failed_at,
          BatchStatus.EXPIRED: b.expired_at, BatchStatus.CANCELLED: b.cancelled_at}[
        BatchStatus(b.status)]
    return at if at is not None else now()


@dataclass(frozen=True)
class Event:
    """One event of the stream: ``kind`` is ``status`` or ``progress``; ``status`` and
    ``at`` are the status the event announces and when it was reached (for a progress
    event: the current status, and when the counts were read)."""

    kind: str
    position: Position
    status: str
    at: int
    snapshot: Snapshot

    @property
    def id(self) -> str:
        return str(self.position)

    @property
    def last(self) -> bool:
        """The stream ends after this event: the batch's terminal status."""
        return self.kind == STATUS and self.status in TERMINAL


def read(ctx: Context, tenant_id: str, batch_id: str) -> Snapshot:
    """The batch's current state (its row and its shards' sums as of one moment), in a
    session that ends before this returns."""
    with ctx.db.snapshot() as s:
        b = repo.get_batch(s, tenant_id, batch_id)
        if b is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return Snapshot(b, repo.shard_sums(s, [b.id]).get(b.id, repo.ShardSums()))


def check_resumable(snap: Snapshot, seen: Position) -> None:
    """A position the batch has not reached is no id this stream sent (another batch's,
    or made up): refused rather than taken as a place to wait from."""
    if seen.rank > RANK[snap.status] or seen.done > snap.done:
        raise InvalidRequest(f"Last-Event-ID {seen} is not an event of this batch: it is "
                             f"at {snap.position}", param="Last-Event-ID")


def events_after(snap: Snapshot, seen: Position) -> list[Event]:
    """What a client at ``seen`` has not been told: each status reached since, then
    the counts if more requests are done. Every event's position is above ``seen`` and
    above the event before it."""
    done = snap.done
    out = [Event(STATUS, Position(RANK[st], done), st, at, snap)
           for st, at in snap.reached() if RANK[st] > seen.rank]
    if not out and done > seen.done:
        out.append(Event(PROGRESS, snap.position, snap.status, now(), snap))
    return out


def follow(first: Snapshot, seen: Position, next_snapshot: Callable[[float], Snapshot], *,
           keepalive_s: float, max_s: float,
           clock: Callable[[], float] = time.monotonic) -> Iterator[Event | None]:
    """The events after ``seen``, from ``first`` (already read) on, each later state
    from ``next_snapshot(timeout)`` (a :class:`Watcher`'s: the batch once it changed,
    or as it is after ``timeout``); ``None`` when ``keepalive_s`` passed without an
    event (the caller sends a keep-alive, which is also how a client that went away is
    noticed). Ends after the terminal status's event, or after ``max_s`` (the client
    resumes from its last id)."""
    started = last_sent = clock()
    snap = first
    while True:
        for ev in events_after(snap, seen):
            yield ev
            seen, last_sent = ev.position, clock()
            if ev.last:
                return
        if snap.terminal and seen.rank == TERMINAL_RANK:
            return
        if clock() - started >= max_s:
            return
        if clock() - last_sent >= keepalive_s:
            yield None
            last_sent = clock()
        due = min(last_sent + keepalive_s, started + max_s)
        snap = next_snapshot(max(0.0, due - clock()))


Key = tuple[str, str]  # (project, batch)


class _Followed:
    """One followed batch: its latest state, how many follow it, and the condition
    its followers wait on (woken only when its position moves)."""

    def __init__(self, first: Snapshot, lock: threading.Lock) -> None:
        self.latest, self.followers, self.changes = first, 0, 0
        self.error: Exception | None = None
        self.changed = threading.Condition(lock)


class Watcher:
    """The batches this process's event streams follow, read together: every
    ``poll_s`` one read of all of them (their rows by key, their shards' sums grouped
    by batch), however many streams follow each; only the followers of a batch whose
    position moved are woken. Ten thousand followers cost one query a poll and a
    wake-up per event or keep-alive, not ten thousand of each. A poll that fails (the
    database is away) fails the next read of every stream."""

    def __init__(self, ctx: Context, poll_s: float) -> None:
        self.ctx, self.poll_s = ctx, poll_s
        self._lock = threading.Lock()
        self._batches: dict[Key, _Followed] = {}
        self._polling = False

    @contextlib.contextmanager
    def following(self, tenant_id: str, first: Snapshot
                  ) -> Iterator[Callable[[float], Snapshot]]:
        """While inside, the batch (``first``: as last read) is read each poll; yields
        its ``next_snapshot``."""
        key = (tenant_id, first.batch.id)
        with self._lock:
            f = self._batches.get(key)
            if f is None:
                f = self._batches[key] = _Followed(first, self._lock)
            f.followers += 1
            if not self._polling:
                self._polling = True
                threading.Thread(target=self._poll, name="inferq-events", daemon=True).start()
        seen = [f.changes]

        def next_snapshot(timeout: float) -> Snapshot:
            with self._lock:
                f.changed.wait_for(lambda: f.changes > seen[0], timeout)
                seen[0] = f.changes
                if f.error is not None:
                    raise f.error
                return f.latest
        try:
            yield next_snapshot
        finally:
            with self._lock:
                f.followers -= 1
                if f.followers <= 0:
                    del self._batches[key]

    def followed(self) -> int:
        with self._lock:
            return len(self._batches)

    def _poll(self) -> None:
        while True:
            time.sleep(self.poll_s)
            with self._lock:
                keys = list(self._batches)
                if not keys:
                    self._polling = False
                    return
            error: Exception | None = None
            try:
                snaps = read_many(self.ctx, keys)
            except Exception as e:  # noqa: BLE001 - each stream decides what a failure means
                snaps, error = {}, e
            with self._lock:
                for key, f in self._batches.items():
                    snap = snaps.get(key)
                    if error is None and (snap is None or snap.position == f.latest.position):
                        f.error = None
                        continue  # nothing a follower would be told
                    if snap is not None:
                        f.latest = snap
                    f.error = error
                    f.changes += 1
                    f.changed.notify_all()


def read_many(ctx: Context, keys: list[Key]) -> dict[Key, Snapshot]:
    """The current state of each batch named, rows and sums as of one moment (a batch of
    another project than its key's is not read)."""
    with ctx.db.snapshot() as s:
        batches = repo.get_batches(s, [b for _, b in keys])
        sums = repo.shard_sums(s, [b.id for b in batches])
    wanted = set(keys)
    return {(b.tenant_id, b.id): Snapshot(b, sums.get(b.id, repo.ShardSums()))
            for b in batches if (b.tenant_id, b.id) in wanted}
