"""The generation engine: continuous batching scheduled per decode step.

One thread owns the chat model. Each step it (1) drops sequences whose caller
went away, (2) admits waiting sequences by priority — realtime first, and
realtime may exceed the batch's row cap so it never waits for a slot — with a
prefill whose cache is merged into the running batch, and (3) runs one decode
step for every running sequence. Work from all sources (realtime, jobs, batch
shards, flex) shares the same forward passes.

Its forward passes, and what it does when one runs out of memory or raises, are
``passes``'s; sampling and delivering the output, ``delivery``'s; the queue and the
running batch's cache rows, ``rows``'s. A request of several choices runs as
``workers.engines.fanout`` describes.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import torch

from jobs.tenants.usage import split
from workers.engines.embeddings import blame
from workers.engines.fanout import twins
from workers.engines.generation.grammars import Grammars
from workers.engines.generation.passes import Passes
from workers.engines.generation.sequence import Seq
from workers.engines.prefix_cache import PrefixCache
from workers.engines.request import GenRequest
from workers.engines.scheduling import (
    REALTIME,
    fair_index,
    over_share,
    project_of,
    projects_waiting,
    take,
)
from workers.engines.sinks import FinishReason, Sink
from workers.engines.stats import GenStats
from workers.engines.token_texts import TokenTexts
from workers.models.chat import KV, ChatModel, Past

Prefilled = tuple[list[Seq], torch.Tensor, KV, list[int]]  # (group, logits, cache, computed)

log = logging.getLogger("inferq.generation")


class GenerationEngine(Passes):
    name = "transformers"

    def __init__(self, model: ChatModel, max_batch_rows: int = 32, max_rows: int = 64,
                 max_prefill_tokens: int = 4096,
                 on_step: Callable[[int, float], None] | None = None,
                 prefix_cache: PrefixCache | None = None,
                 batch_prefill_tokens: int | None = None, realtime_quiet_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.model = model
        self.max_batch_rows = max_batch_rows  # rows for jobs/batch/flex work
        self.max_rows = max_rows  # hard cap, realtime included
        # Prompt tokens computed per step at most (cached ones are free); a prompt
        # beyond what is left of it is prefilled in chunks over several steps. The
        # small budget protects realtime streams and holds while one has been seen in
        # the last ``realtime_quiet_s``; without them a step may compute
        # ``batch_prefill_tokens`` (fewer, larger prefills: more tokens/s).
        self.max_prefill_tokens = max_prefill_tokens
        self.batch_prefill_tokens = (max_prefill_tokens if batch_prefill_tokens is None
                                     else max(batch_prefill_tokens, max_prefill_tokens))
        self.realtime_quiet_s = realtime_quiet_s
        self._clock = clock
        self._realtime_at = -math.inf  # when the last realtime sequence was submitted
        self.cache = prefix_cache
        self.on_step = on_step
        self.stats = GenStats()
        # The rows of the running batch's cache, in order. A finished sequence stays in
        # its row as a hole until a joining sequence takes the row over in place or the
        # holes are many enough to compact (``_reap``): moving a long batch's cache
        # costs more than several decode steps.
        self._running: list[Seq] = []
        self._kv: KV | None = None
        self._fit_rows: int | None = None  # rows that fitted when memory last ran out
        self._clean_steps = 0
        self._finishing: list[tuple[Seq, FinishReason]] = []  # told at the step's end
        self._faults: list[tuple[Seq, Exception]] = []  # failed alone; told at its end
        self._computed = False  # a forward pass of this step computed some rows
        self._rushed = False  # the last step was a realtime prefill alone
        self._texts: TokenTexts | None = None  # token texts for log probabilities
        self.grammars = Grammars(model)
        self._start_loop(self._loop, "inferq-generate")

    def submit(self, req: GenRequest, sink: Sink, priority: int) -> None:
        if priority == REALTIME:
            self._realtime_at = self._clock()
        super().submit(req, sink, priority)

    def _new(self, req: GenRequest, sink: Sink, priority: int, seed: int | None) -> Seq:
        s = Seq(req, sink, priority, next(self._order), pos=len(req.prompt))
        if seed is not None:
            s.gen = torch.Generator().manual_seed(seed)
        if req.constraint is not None:
            s.matcher = self.grammars.matcher(req.constraint)
        return s

    def load(self) -> tuple[int, int]:
        """(running, waiting) sequences."""
        with self._cond:
            return len(self._live()), len(self._waiting)

    # The loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._await_work():
                    break
                admitted = self._admit()
            try:
                self.step(admitted)
            except Exception as e:  # noqa: BLE001 - a failed step fails its sequences
                log.exception("generation step failed")
                for s in self._running + admitted:
                    if not s.done:
                        s.done = True
                        s.sink.fail(e)
                self._running, self._kv = [], None
        err = RuntimeError("the engine stopped")
        for s in self._live() + [w[2] for w in self._waiting]:
            s.sink.fail(err)

    def _has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def prefill_budget(self) -> int:
        """Prompt tokens the next step may compute: the small budget while realtime
        streams are about (one waiting, or one submitted within the quiet time)."""
        recent = self._clock() - self._realtime_at < self.realtime_quiet_s
        if recent or (self._waiting and self._waiting[0][0] == REALTIME):
            return self.max_prefill_tokens
        return self.batch_prefill_tokens

    def _admit(self) -> list[Seq]:
        """Called under the lock each step: pop waiting sequences that fit, in priority
        order, within the step's prefill budget; the first that does not fit whole
        takes what is left of the budget as a chunk. Realtime rows are never joined by
        other prefills in their step. Realtime sequences are taken fairly by project
        (``scheduling.fair_index``); one that finds the rows full while its project is
        below its share takes a row of the project furthest above its (``_yield_row``)."""
        out: list[Seq] = []
        budget = self.prefill_budget()
        live = self._live()
        rows = len(live)
        batch_rows = sum(s.priority != REALTIME for s in live)  # realtime takes no slot
        held = Counter(project_of(s) for s in live if s.priority == REALTIME)
        starts: set[int] = set()  # requests one of whose sequences starts whole this step
        cap = self.max_rows if self._fit_rows is None else min(self.max_rows, self._fit_rows)
        while self._waiting and budget > 0:
            i = fair_index(self._waiting, held)
            prio, _, s = self._waiting[i]
            full = rows >= cap or (prio != REALTIME and batch_rows >= self.max_batch_rows)
            if full and prio == REALTIME and self._yield_row(project_of(s), cap - batch_rows, held):
                rows -= 1  # (its row went back to the queue: pick again)
                continue
            # A step that prefills realtime rows prefills nothing else: their first
            # token is due at its end, and other prefills would lengthen it.
            if full or (prio != REALTIME and out and out[0].priority == REALTIME):
                break
            take(self._waiting, i)
            if s.done or s.sink.cancelled():
                if not s.done and s.started:  # preempted, then its caller went away
                    self._abandon(s)
                continue
            tokens = s.tokens()
            done = max(s.past.length if s.past is not None else 0,
                       self.cache.cached(tokens) if self.cache is not None else 0)
            need = len(tokens) - done
            fresh = not s.generated and s.past is None
            if fresh and id(s.req) in starts:
                need = 0  # its prompt is computed once for the request (``_prefill``)
            out.append(s)
            if prio == REALTIME:
                held[project_of(s)] += 1
            if need > budget:  # a chunk now, the rest in later steps
                s.chunk_to = done + budget
                break
            s.chunk_to = None
            if fresh:
                starts.add(id(s.req))
            rows += 1
            batch_rows += prio != REALTIME
            budget -= need
        return out

    def _prefill(self, seqs: list[Seq], crowded: bool, deferred: list[Seq]
                 ) -> list[Prefilled]:
        """``Passes._prefill``, with the sequences of one request that start together
        from its prompt (``fanout.twins``: a request of n choices) computing it once:
        the others take its logits and its row of the cache as theirs (nothing computed,
        nothing charged). One whose twin was deferred is deferred; one whose twin failed
        alone fails with it."""
        copies = twins(seqs)
        if not copies:
            return super()._prefill(seqs, crowded, deferred)
        later = {j for js in copies.values() for j in js}
        firsts = [s for i, s in enumerate(seqs) if i not in later]
        rest = {id(seqs[i]): [seqs[j] for j in js] for i, js in copies.items()}
        out: list[Prefilled] = []
        for group, logits, kv, computed in super()._prefill(firsts, crowded, deferred):
            rows, grown, done = [], [], []
            for i, s in enumerate(group):
                for t in [s, *rest.pop(id(s), [])]:
                    rows.append(i)
                    grown.append(t)
                    done.append(computed[i] if t is s else 0)
            if len(rows) > len(group):
                logits, kv = logits[rows], kv.select(rows)
            out.append((grown, logits, kv, done))
        failed = {id(s): e for s, e in self._faults}
        for key, left in rest.items():  # their twin was deferred, or failed alone
            for t in left:
                if key in failed:
                    self._fault(t, failed[key])
                else:
                    deferred.append(t)
        return out

    def _yield_row(self, project: str, rows: int, held: Counter[str]) -> bool:
        """The rows are full and ``project`` waits for one: if it is below its share of
        the ``rows`` realtime rows, the project furthest above its share gives up its
        running row of least output (``scheduling.over_share``): it goes back to the
        queue with what it generated and resumes as a preempted row does (a prefill of
        prompt + output, nothing sent twice). True when a row was freed."""
        donor = over_share(project, rows, held, projects_waiting(self._waiting))
        if donor is None:
            return False
        slot = min((j for j, r in enumerate(self._running)
                    if not r.done and r.priority == REALTIME and project_of(r) == donor),
                   key=lambda j: (len(self._running[j].generated), -self._running[j].order),
                   default=None)
        if slot is None:
            return False
        victim = self._running[slot]
        self._running[slot] = replace(victim, done=True)  # a hole, until a row joins
        victim.past, victim.chunk_to = None, None
        held[donor] -= 1
        self.stats.yielded += 1
        self._enqueue(victim)
        return True

    def step(self, admitted: list[Seq]) -> None:
        """One engine step: prefill the admitted, then decode every running sequence.

        The step's time is charged to the sequences it computed (``_settle``) before
        the ones that finished in it are told, so their usage includes this step."""
        t0 = time.perf_counter()
        charged: list[tuple[Seq, int]] = []
        try:
            rows = self._step(admitted, charged)
        finally:
            dt = time.perf_counter() - t0
            self._settle(charged, dt)
        self.stats.steps += 1
        self.stats.step_s += dt
        self.stats.recent_steps.append(dt)
        self.stats.max_rows = max(self.stats.max_rows, rows)
        if self.on_step is not None:
            self.on_step(rows, dt)

    def _settle(self, charged: list[tuple[Seq, int]], dt: float) -> None:
        """Split the step's ``dt`` among ``charged`` (sequence, its tokens in the step),
        then deliver the step's finishes and its failures."""
        for (s, _), share in zip(charged, split(dt, [w for _, w in charged]), strict=True):
            s.accel_s += share
        finishing, self._finishing = self._finishing, []
        for s, reason in finishing:
            s.sink.finish(reason, s.usage())
        faults, self._faults = self._faults, []
        for s, e in faults:
            s.sink.fail(blame("the next token of this request", e, self._computed))

    def _step(self, admitted: list[Seq], charged: list[tuple[Seq, int]]) -> int:
        self._drop_cancelled()
        self._computed = False
        prev = self._running
        joined: list[Seq] = []
        new_kv = None
        oom = False
        if admitted:  # prefill first: a joining realtime sequence gets its token now
            for s in admitted:
                if not s.started:
                    s.started = True
                    self._start(s, charged)
            admitted = [s for s in admitted if not s.done]
        if admitted:
            deferred: list[Seq] = []
            chunked: list[Seq] = []
            faults = len(self._faults)
            for group, logits, kv, computed in self._prefill(admitted, bool(prev), deferred):
                whole = [i for i, s in enumerate(group) if s.chunk_to is None]
                for i, s in enumerate(group):
                    charged.append((s, computed[i]))
                    if s.chunk_to is not None:  # this chunk's state, for its next step
                        s.past = Past.of_row(kv, i, s.chunk_to)
                        s.chunk_to = None
                        chunked.append(s)
                        self.stats.chunks += 1
                    else:
                        s.past = None
                        s.pos = len(s.tokens())
                if not whole:
                    continue
                if len(whole) < len(group):
                    kv, logits = kv.select(whole).trim(), logits[whole]
                    group = [group[i] for i in whole]
                self._advance(group, logits)
                new_kv = KV.concat(new_kv, kv)
                joined += group
            for s in deferred + chunked:  # deferred: it fits once some of the batch ended
                self._enqueue(s)
            if deferred:
                self._fit_rows = max(1, len(self._live()) + len(joined))
            faults = len(self._faults) - faults
            oom = bool(deferred) or len(joined) + len(chunked) + faults < len(admitted)
        # A step that prefilled realtime rows ends there: their first token is out, and
        # the running rows decode in the next step (one step later, not one step longer).
        # Never twice in a row, so that arrivals at every step cannot stall the decodes.
        rushed = bool(admitted) and admitted[0].priority == REALTIME and not self._rushed
        self._rushed = rushed
        if prev and not rushed:
            prev, shed = self._decode(prev, charged)
            oom = oom or shed
        if new_kv is not None:
            self._join(prev, joined, new_kv)
        else:
            self._running = prev
        if not self._running:
            self._kv = None
        rows = len(self._live())
        self._reap()
        self._grow_back(oom)
        return rows
