"""The transformers generation engine's queue and running batch: sequences waiting by
priority, and the rows of the running batch's key/value cache. A finished sequence
stays in its row as a hole until a joining sequence takes the row over in place or the
holes are many enough to compact the cache."""

from __future__ import annotations

from workers.engines.generation.sequence import Seq
from workers.engines.scheduling import PriorityQueued
from workers.engines.stats import GenStats
from workers.models.chat import KV


class RunningRows(PriorityQueued[Seq]):
    """The waiting queue (``PriorityQueued``'s) and the running rows of
    ``GenerationEngine``, which sets up their state."""

    stats: GenStats
    _running: list[Seq]
    _kv: KV | None

    def _abandon(self, s: Seq) -> None:
        """``s`` is dropped because its caller went away: a sink that bills abandoned
        work (``abandoned(usage)``) is told what it used until then."""
        s.done = True
        abandoned = getattr(s.sink, "abandoned", None)
        if abandoned is not None:
            abandoned(s.usage())

    def _drop_cancelled(self) -> None:
        """Drop sequences whose caller went away; a sink that bills abandoned work
        (``abandoned(usage)``) is told what the sequence used until then."""
        for s in self._running:
            if not s.done and s.sink.cancelled():
                self._abandon(s)
        self._reap()

    def _live(self) -> list[Seq]:
        return [s for s in self._running if not s.done]

    def _join(self, prev: list[Seq], joined: list[Seq], new_kv: KV) -> None:
        """Add the prefilled ``joined`` (rows of ``new_kv``) to the batch: into holes in
        place where the cache is wide enough, after the last row otherwise."""
        if not prev:
            self._running, self._kv = joined, new_kv
            return
        assert self._kv is not None
        holes = [i for i, s in enumerate(prev) if s.done]
        width = self._kv.width
        fit = [j for j, n in enumerate(new_kv.spans()) if n <= width][: len(holes)]
        if fit:
            self._kv.place(holes[: len(fit)], new_kv.select(fit))
            for slot, j in zip(holes, fit, strict=False):
                prev[slot] = joined[j]
            self.stats.refills += len(fit)
        rest = [j for j in range(len(joined)) if j not in set(fit)]
        if rest:
            self._kv = KV.concat(self._kv, new_kv if not fit else new_kv.select(rest))
        self._running = prev + [joined[j] for j in rest]

    def _reap(self) -> None:
        """Finished sequences leave holes while sequences wait to fill them (at the
        next step, in place); the cache is compacted when nothing waits, or when the
        holes are half its rows."""
        holes = [i for i, s in enumerate(self._running) if s.done]
        if not holes:
            return
        keep = [i for i, s in enumerate(self._running) if not s.done]
        if not keep or self._kv is None:
            self._running, self._kv = [], None
        elif not self._waiting or 2 * len(holes) >= len(self._running):
            self._running = [self._running[i] for i in keep]
            self._kv = self._kv.select(keep).trim()
            self.stats.compactions += 1
        else:  # masked out, so that columns only holes used can be trimmed
            self._kv.clear(holes)
            self._kv = self._kv.trim()
