"""A batch's event positions (jobs/batches/progress.py), on batch rows built in memory: the ids
only grow, and a client resuming from any id it was sent is told every status it
missed and the latest counts."""

from __future__ import annotations

import pytest

from jobs.batches import progress
from jobs.batches.queries import ShardSums
from jobs.core.errors import InvalidRequest
from jobs.core.schema import Batch
from jobs.core.status import ALLOWED, TERMINAL, BatchStatus


def test_every_allowed_transition_raises_the_rank() -> None:
    """What the ids rest on: a batch reaches each status at most once, in rank order."""
    assert set(progress.RANK) == set(BatchStatus)
    for src, targets in ALLOWED.items():
        for dst in targets:
            assert progress.RANK[src] < progress.RANK[dst], (src, dst)
    assert {progress.RANK[s] for s in TERMINAL} == {progress.TERMINAL_RANK}


def batch(status: str, done: tuple[int, int] = (0, 0), invalid: int = 0, total: int = 10,
          **times: int) -> progress.Snapshot:
    b = Batch(id="batch_1", status=status, invalid=invalid, total=total, created_at=100,
              in_progress_at=None, cancelling_at=None, finalizing_at=None, completed_at=None,
              failed_at=None, expired_at=None, cancelled_at=None)
    for k, v in times.items():
        setattr(b, k, v)
    return progress.Snapshot(b, ShardSums(done[0], done[1], 5 * done[0], 0))


# A batch's life as successive reads (what polls see), along each path it can take.
LIVES = {
    "completed": [
        batch("validating"),
        batch("in_progress", (0, 0), invalid=1, in_progress_at=101),
        batch("in_progress", (4, 1), invalid=1, in_progress_at=101),
        batch("in_progress", (8, 1), invalid=1, in_progress_at=101),
        # finalize commits finalizing and the terminal status together
        batch("completed", (8, 1), invalid=1, in_progress_at=101, finalizing_at=105,
              completed_at=106),
    ],
    "cancelled": [
        batch("validating"),
        batch("in_progress", (3, 0), in_progress_at=101),
        batch("cancelling", (3, 0), in_progress_at=101, cancelling_at=102),
        batch("cancelling", (5, 0), in_progress_at=101, cancelling_at=102),
        batch("cancelled", (5, 5), in_progress_at=101, cancelling_at=102, cancelled_at=104),
    ],
    "expired": [
        batch("validating"),
        batch("in_progress", (2, 0), in_progress_at=101, expired_at=103),
        batch("expired", (2, 8), in_progress_at=101, expired_at=103, finalizing_at=104),
    ],
    "failed at validation": [batch("validating"), batch("failed", failed_at=101)],
    "cancelled while validating": [
        batch("validating"),
        batch("cancelling", cancelling_at=101),
        batch("cancelled", cancelling_at=101, cancelled_at=102),
    ],
}
PATHS = {
    "completed": ["validating", "in_progress", "finalizing", "completed"],
    "cancelled": ["validating", "in_progress", "cancelling", "cancelled"],
    "expired": ["validating", "in_progress", "finalizing", "expired"],
    "failed at validation": ["validating", "failed"],
    "cancelled while validating": ["validating", "cancelling", "cancelled"],
}


def stream(reads: list[progress.Snapshot], seen: progress.Position) -> list[progress.Event]:
    out: list[progress.Event] = []
    for snap in reads:
        progress.check_resumable(snap, seen)
        for ev in progress.events_after(snap, seen):
            assert ev.position > seen
            out.append(ev)
            seen = ev.position
    return out


@pytest.mark.parametrize("life", sorted(LIVES))
def test_a_stream_tells_every_status_once_in_order(life: str) -> None:
    events = stream(LIVES[life], progress.START)
    assert [e.status for e in events if e.kind == progress.STATUS] == PATHS[life]
    done = [e.position.done for e in events]
    assert done == sorted(done) and done[-1] == LIVES[life][-1].done
    assert events[-1].last and not any(e.last for e in events[:-1])
    assert [str(e.position) for e in events] == [e.id for e in events]


@pytest.mark.parametrize("life", sorted(LIVES))
def test_resuming_from_any_id_misses_nothing(life: str) -> None:
    """A client that drops after any event and comes back at any later read is told
    every status it missed, and ends at the final counts."""
    reads = LIVES[life]
    full = stream(reads, progress.START)
    for cut, seen_ev in enumerate(full):
        before = full[:cut + 1]
        for back in range(len(reads)):
            p, seen = reads[back].position, seen_ev.position
            if p.rank < seen.rank or p.done < seen.done:
                continue  # a read from before the event: the client cannot be ahead of it
            after = stream(reads[back:], seen)
            statuses = [e.status for e in before + after if e.kind == progress.STATUS]
            assert statuses == PATHS[life], (cut, back)
            last = (before + after)[-1]
            assert last.last and last.position.done == reads[-1].done


def test_the_first_read_of_an_ended_batch_tells_its_whole_path() -> None:
    events = progress.events_after(LIVES["completed"][-1], progress.START)
    assert [(e.status, e.at) for e in events] == [
        ("validating", 100), ("in_progress", 101), ("finalizing", 105), ("completed", 106)]
    assert [e.id for e in events] == ["0-10", "1-10", "3-10", "4-10"]


def test_last_event_ids() -> None:
    assert progress.parse_position(None) == progress.START
    assert progress.parse_position("") == progress.START
    assert progress.parse_position("1-250") == progress.Position(1, 250)
    for bad in ("x", "1-", "-1", "5-0", "1-01", "1-2-3", "1- 2", "1-" + "9" * 13, "٣-1"):
        with pytest.raises(InvalidRequest) as e:
            progress.parse_position(bad)
        assert e.value.param == "Last-Event-ID"
    snap = LIVES["completed"][2]  # in_progress, 6 done
    progress.check_resumable(snap, progress.Position(1, 6))
    for ahead in (progress.Position(2, 0), progress.Position(1, 7)):
        with pytest.raises(InvalidRequest, match="not an event of this batch"):
            progress.check_resumable(snap, ahead)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_follow_sends_keep_alives_and_ends_at_its_time_limit() -> None:
    """``follow`` reads again each poll; with nothing new it yields None once per
    keep-alive period, and it stops at max_s without a terminal event."""
    reads = iter([LIVES["completed"][1]] * 100)
    clock = Clock()
    calls: list[float] = []

    def next_snapshot(timeout: float) -> progress.Snapshot:  # a watcher's: nothing changes
        clock.sleep(min(1.0, timeout))
        calls.append(clock.t)
        return next(reads)

    out = list(progress.follow(LIVES["completed"][0], progress.START, next_snapshot,
                               keepalive_s=3.0, max_s=10.0, clock=clock))
    kinds = ["keep-alive" if e is None else e.status for e in out]
    assert kinds == ["validating", "in_progress", "keep-alive", "keep-alive"]  # at 4 s, 7 s
    assert len(calls) == 10 and clock.t == 10.0
