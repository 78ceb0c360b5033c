"""The generation engine: continuous batching scheduled per decode step.

One thread owns the chat model. Each step it (1) drops sequences whose caller
went away, (2) admits waiting sequences by priority — realtime first, and
realtime may exceed the batch's row cap so it never waits for a slot — with a
prefill whose cache is merged into the running batch, and (3) runs one decode
step for every running sequence. Work from all sources (realtime, jobs, batch
shards, flex) shares the same forward passes.

Out of memory: a prefill that does not fit is split in halves; a sequence that
does not fit while others hold memory waits for them, and one that does not fit
alone fails by itself. A decode step that does not fit preempts the newest,
least urgent half of the batch: those sequences go back to the queue with what
they generated so far and resume by a prefill of prompt + output (nothing is
sent twice), and the row cap shrinks to what fitted, growing back one row per
``GROW_EVERY`` clean steps.

A forward pass that raises anything else is run again in halves, down to the rows
that raise alone; so is a decode (a failed decode leaves the cache as it was:
``decode_step`` builds new tensors), on the rows of the cache each half selects.
Sampling is per row. Only the rows that raise alone fail: at the end of the step,
with the request's error (400) when the step computed other rows, else the server's
(``blame``). Every other row gets the output it gets without them.

A request of several choices (``n``, ``best_of``), or with log probabilities or an
echo, is ``best_of`` sequences submitted together (``_Fan``): each is a sequence like
any other (scheduled, preempted, bisected alone; the prefix cache lets the ones admitted
after the first take its prompt), and the request's sink is told of them as choices:
``piece(index, text, tokens)`` as they are generated (or, when best_of > n, the n of
highest mean log probability once all are done), ``choice_end(index, reason)`` per choice,
then ``finish`` with the usage of them all. A sequence that fails fails its request
(the others are dropped); it never fails another request. With seed s, sequence i
draws from its own generator seeded s + i.
"""

from __future__ import annotations

import codecs
import functools
import heapq
import itertools
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar, cast

import torch

from jobs.protocol.structured import Constraint
from jobs.tenants.usage import split
from workers.engines.embeddings import blame, is_oom, too_large
from workers.engines.prefix_cache import PrefixCache
from workers.engines.request import GenRequest
from workers.engines.responses import Choice, TokenLogprob
from workers.engines.sampling import Pick, adjusted, choose, holdback, log_probs, stop_at, top_of
from workers.models.chat import KV, ChatModel, Past

log = logging.getLogger("inferq.generation")
GROW_EVERY = 8  # clean steps per row the out-of-memory cap grows back


class FinishReason(StrEnum):
    """Why a sequence ended (the OpenAI ``finish_reason``)."""

    STOP = "stop"  # an end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens or the context window


class Sink(Protocol):
    """Receives a sequence's output; called on the engine thread, must not block.

    A sink may also have ``abandoned(usage)``: called, instead of ``finish``, with
    what the sequence used when the engine drops it because ``cancelled()`` is true
    (a stream whose client went away is billed for what was generated)."""

    def start(self) -> None: ...
    def delta(self, text: str) -> None: ...
    def finish(self, reason: FinishReason, usage: Usage) -> None: ...
    def fail(self, error: Exception) -> None: ...
    def cancelled(self) -> bool: ...


class ChoiceSink(Sink, Protocol):
    """The sink of a request that fans out (``GenRequest.fans``): told of each choice's
    text and tokens (``tokens`` None when no log probabilities were asked for) and of its
    end, before ``finish`` (the first choice's reason, every sequence's usage)."""

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None: ...
    def choice_end(self, index: int, reason: str) -> None: ...


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    batch_rows: int  # the most rows of any engine step this sequence was part of
    # Its share of the engine steps it took part in: each step's time split among the
    # step's sequences by their tokens in it (a prefill's length, 1 for a decode).
    accelerator_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens taken from the engine's prefix cache


@dataclass
class _Seq:
    req: GenRequest
    sink: Sink
    priority: int
    order: int
    generated: list[int] = field(default_factory=list)
    emitted: int = 0  # characters of decoded text already delivered
    gen: torch.Generator | None = None
    pos: int = 0
    done: bool = False
    rows: int = 0
    started: bool = False
    accel_s: float = 0.0  # accelerator-seconds charged so far
    # Chunked prefill: the state of the first tokens computed in earlier steps, and
    # how far this step's chunk goes (None: to the end, then the sequence joins).
    past: Past | None = None
    chunk_to: int | None = None
    counts: dict[int, int] = field(default_factory=dict)  # generated tokens (penalties)
    logprob_sum: float = 0.0  # of the sampled tokens, when scored (best_of's ranking)
    pending: list[TokenLogprob] = field(default_factory=list)  # not yet delivered
    text_len: int = 0  # characters of the decoded text before the last token
    # Structured outputs: the llguidance matcher of its constraint, fed every token it
    # generated. It stays with the sequence when it is preempted and resumes.
    matcher: Any = None

    def usage(self) -> Usage:
        return Usage(len(self.req.prompt), len(self.generated), self.rows, self.accel_s)

    def tokens(self) -> list[int]:
        """What a (re)starting prefill runs: the prompt plus anything generated."""
        return self.req.prompt + self.generated


@dataclass
class GenStats:
    steps: int = 0
    prefills: int = 0
    tokens: int = 0
    tokens_by_priority: dict[int, int] = field(default_factory=dict)
    max_rows: int = 0
    oom_splits: int = 0  # prefills split in halves
    preemptions: int = 0  # sequences sent back to the queue by a decode step's OOM
    oom_failures: int = 0  # sequences that did not fit even alone
    fault_splits: int = 0  # passes that raised (not out of memory), run again in halves
    faults: int = 0  # sequences whose forward pass or sampling raised alone
    prefill_tokens: int = 0  # prompt tokens computed by prefills
    cached_tokens: int = 0  # prompt tokens whose state came from the prefix cache or chunks
    chunks: int = 0  # partial prefills of prompts longer than a step's prefill budget
    refills: int = 0  # sequences that took over a finished one's cache row in place
    compactions: int = 0  # times the cache was copied to drop finished rows
    step_s: float = 0.0
    recent_steps: deque[float] = field(default_factory=lambda: deque(maxlen=4096))

    def snapshot(self) -> dict[str, Any]:
        steps = sorted(self.recent_steps)
        p99 = steps[int(0.99 * (len(steps) - 1))] if steps else 0.0
        return {"steps": self.steps, "prefills": self.prefills, "tokens": self.tokens,
                "tokens_by_priority": {str(k): v for k, v in self.tokens_by_priority.items()},
                "max_rows": self.max_rows, "oom_splits": self.oom_splits,
                "preemptions": self.preemptions, "oom_failures": self.oom_failures,
                "fault_splits": self.fault_splits, "faults": self.faults,
                "prefill_tokens": self.prefill_tokens, "cached_tokens": self.cached_tokens,
                "chunks": self.chunks, "refills": self.refills,
                "compactions": self.compactions,
                "step_s": self.step_s, "recent_step_p99_s": p99,
                "recent_step_p50_s": steps[len(steps) // 2] if steps else 0.0}


class GenerationEngine:
    name = "transformers"
    def __init__(self, model: ChatModel, max_batch_rows: int = 32, max_rows: int = 64,
                 max_prefill_tokens: int = 4096,
                 on_step: Callable[[int, float], None] | None = None,
                 prefix_cache: PrefixCache | None = None,
                 batch_prefill_tokens: int | None = None, realtime_quiet_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
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
        self._waiting: list[tuple[int, int, _Seq]] = []
        # The rows of the running batch's cache, in order. A finished sequence stays in
        # its row as a hole until a joining sequence takes the row over in place or the
        # holes are many enough to compact (``_reap``): moving a long batch's cache
        # costs more than several decode steps.
        self._running: list[_Seq] = []
        self._kv: KV | None = None
        self._fit_rows: int | None = None  # rows that fitted when memory last ran out
        self._clean_steps = 0
        self._finishing: list[tuple[_Seq, FinishReason]] = []  # told at the step's end
        self._faults: list[tuple[_Seq, Exception]] = []  # failed alone; told at its end
        self._computed = False  # a forward pass of this step computed some rows
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._stop = False
        self._rushed = False  # the last step was a realtime prefill alone
        self._texts: TokenTexts | None = None  # token texts for log probabilities
        self.grammars = Grammars(model)
        self._thread = threading.Thread(target=self._loop, name="inferq-generate", daemon=True)
        self._thread.start()

    def submit(self, req: GenRequest, sink: Sink, priority: int) -> None:
        """Queue ``req``; a request that fans out (``req.fans()``) needs a ChoiceSink."""
        if priority == 0:
            self._realtime_at = self._clock()
        # together: admitted in one step where they fit
        self._enqueue(*sequences(req, sink, lambda s, seed: self._new(req, s, priority, seed)))

    def _new(self, req: GenRequest, sink: Sink, priority: int, seed: int | None) -> _Seq:
        s = _Seq(req, sink, priority, next(self._seq), pos=len(req.prompt))
        if seed is not None:
            s.gen = torch.Generator().manual_seed(seed)
        if req.constraint is not None:
            s.matcher = self.grammars.matcher(req.constraint)
        return s

    def _enqueue(self, *seqs: _Seq) -> None:
        with self._cond:
            for s in seqs:
                heapq.heappush(self._waiting, (s.priority, s.order, s))
            self._cond.notify()

    def load(self) -> tuple[int, int]:
        """(running, waiting) sequences."""
        with self._cond:
            return len(self._live()), len(self._waiting)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=10)

    # The loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._waiting and not self._running:
                    self._cond.wait()
                if self._stop:
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

    def prefill_budget(self) -> int:
        """Prompt tokens the next step may compute: the small budget while realtime
        streams are about (one waiting, or one submitted within the quiet time)."""
        recent = self._clock() - self._realtime_at < self.realtime_quiet_s
        if recent or (self._waiting and self._waiting[0][0] == 0):
            return self.max_prefill_tokens
        return self.batch_prefill_tokens

    def _admit(self) -> list[_Seq]:
        """Called under the lock each step: pop waiting sequences that fit, in priority
        order, within the step's prefill budget; the first that does not fit whole
        takes what is left of the budget as a chunk. Realtime rows are never joined by
        other prefills in their step."""
        out: list[_Seq] = []
        budget = self.prefill_budget()
        live = self._live()
        rows = len(live)
        batch_rows = sum(s.priority != 0 for s in live)  # realtime takes no slot
        cap = self.max_rows if self._fit_rows is None else min(self.max_rows, self._fit_rows)
        while self._waiting and budget > 0:
            prio, _, s = self._waiting[0]
            full = rows >= cap or (prio != 0 and batch_rows >= self.max_batch_rows)
            # A step that prefills realtime rows prefills nothing else: their first
            # token is due at its end, and other prefills would lengthen it.
            if full or (prio != 0 and out and out[0].priority == 0):
                break
            if s.done or s.sink.cancelled():
                heapq.heappop(self._waiting)
                if not s.done and s.started:  # preempted, then its caller went away
                    self._abandon(s)
                continue
            tokens = s.tokens()
            done = max(s.past.length if s.past is not None else 0,
                       self.cache.cached(tokens) if self.cache is not None else 0)
            need = len(tokens) - done
            heapq.heappop(self._waiting)
            out.append(s)
            if need > budget:  # a chunk now, the rest in later steps
                s.chunk_to = done + budget
                break
            s.chunk_to = None
            rows += 1
            batch_rows += prio != 0
            budget -= need
        return out

    def step(self, admitted: list[_Seq]) -> None:
        """One engine step: prefill the admitted, then decode every running sequence.

        The step's time is charged to the sequences it computed (``_settle``) before
        the ones that finished in it are told, so their usage includes this step."""
        t0 = time.perf_counter()
        charged: list[tuple[_Seq, int]] = []
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

    def _settle(self, charged: list[tuple[_Seq, int]], dt: float) -> None:
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

    def _step(self, admitted: list[_Seq], charged: list[tuple[_Seq, int]]) -> int:
        self._drop_cancelled()
        self._computed = False
        prev = self._running
        joined: list[_Seq] = []
        new_kv = None
        oom = False
        if admitted:  # prefill first: a joining realtime sequence gets its token now
            for s in admitted:
                if not s.started:
                    s.started = True
                    self._start(s, charged)
            admitted = [s for s in admitted if not s.done]
        if admitted:
            deferred: list[_Seq] = []
            chunked: list[_Seq] = []
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
        rushed = bool(admitted) and admitted[0].priority == 0 and not self._rushed
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

    def _decode(self, prev: list[_Seq], charged: list[tuple[_Seq, int]]
                ) -> tuple[list[_Seq], bool]:
        """One decode step for the running rows ``prev``; the rows running after it, and
        whether memory ran out. Every row is fed (a hole its old last token, at its old
        position: wasted work, and cheaper than moving the cache); only live rows are
        sampled. A step that raises (not out of memory) is run again on the live rows
        by halves (``_bisect_decode``): the holes leave, as rows that raise alone do."""
        assert self._kv is not None
        live = [i for i, s in enumerate(prev) if not s.done]
        try:
            logits, kv = self._decode_rows(prev, self._kv)
        except Exception as e:  # noqa: BLE001 - contained: the rows that raise alone fail
            if is_oom(e):
                return self._shed(prev, e), True
            contained = self._contain_decode(prev, live, e)
            if contained is None:
                self._kv = None
                return [], False
            prev, logits, kv = contained
            live = list(range(len(prev)))
        self._kv = kv
        for i in live:
            prev[i].pos += 1
            charged.append((prev[i], 1))
        self._advance([prev[i] for i in live], logits[live])
        return prev, False

    # Passes that raise: out of memory, or a fault ---------------------------------------
    def _contain_decode(self, prev: list[_Seq], live: list[int], e: Exception
                        ) -> tuple[list[_Seq], torch.Tensor, KV] | None:
        """The decode of ``prev`` raised ``e``: decode its ``live`` rows by halves; the
        rows that decoded, in order, their logits and their cache (None: none did)."""
        assert self._kv is not None
        base = self._kv if len(live) == len(prev) else self._kv.select(live)
        groups = self._bisect_decode([prev[i] for i in live], base, e)
        if not groups:
            return None
        kv = functools.reduce(KV.concat, [k for _, _, k in groups[1:]], groups[0][2])
        return ([s for seqs, _, _ in groups for s in seqs],
                torch.cat([lg for _, lg, _ in groups]), kv.trim())

    def _decode_rows(self, rows: list[_Seq], kv: KV) -> tuple[torch.Tensor, KV]:
        logits, new = self.model.decode_step([s.generated[-1] for s in rows],
                                             [s.pos for s in rows], kv)
        self._computed = True
        return logits, new

    def _bisect_decode(self, rows: list[_Seq], kv: KV, e: Exception
                       ) -> list[tuple[list[_Seq], torch.Tensor, KV]]:
        """The decode of ``rows`` (rows of ``kv``) raised ``e``: decode its halves apart,
        each on the rows of the cache it selects; a row that raises alone fails
        (``_fault``), and a half that runs out of memory goes back to the queue, to
        resume as a decode that runs out of memory does. The halves that decoded, in
        order: (their rows, logits, grown cache)."""
        if len(rows) == 1:
            self._fault(rows[0], e)
            return []
        self.stats.fault_splits += 1
        half = len(rows) // 2
        out: list[tuple[list[_Seq], torch.Tensor, KV]] = []
        for part, idx in ((rows[:half], range(half)), (rows[half:], range(half, len(rows)))):
            sub = kv.select(list(idx))
            try:
                logits, grown = self._decode_rows(part, sub)
            except Exception as e2:  # noqa: BLE001 - contained, as above
                if is_oom(e2):
                    self._preempt(part)
                else:
                    out += self._bisect_decode(part, sub, e2)
            else:
                out.append((part, logits, grown))
        return out

    def _preempt(self, seqs: list[_Seq]) -> None:
        for s in seqs:
            self._enqueue(s)
        self.stats.preemptions += len(seqs)

    def _fault(self, s: _Seq, e: Exception) -> None:
        """``s`` raised alone (its forward pass or its sampling): it leaves the batch
        now; its sink is told at the step's end, which shows whether the step computed
        other rows (``blame``)."""
        log.warning("a sequence failed alone: %s: %s", type(e).__name__, e)
        s.done = True
        self.stats.faults += 1
        self._faults.append((s, e))

    def _prefill(self, seqs: list[_Seq], crowded: bool, deferred: list[_Seq]
                 ) -> list[tuple[list[_Seq], torch.Tensor, KV, list[int]]]:
        """Prefill ``seqs`` (each up to its ``chunk_to``), in halves while they do not
        fit or while the prefill raises; with each group, the tokens computed per
        sequence. What a sequence already has (its earlier chunks, or the longest cached
        prefix) is not computed again. ``crowded``: other sequences hold memory, so one
        that does not fit is deferred, not failed; one that raises alone fails
        (``_fault``)."""
        prompts = [s.tokens()[: s.chunk_to] for s in seqs]
        lead, follow = self._leaders(seqs, prompts)
        if follow:  # the leaders' prefill puts the shared prefixes in the cache
            first = self._prefill([seqs[i] for i in lead], crowded, deferred)
            return first + self._prefill([seqs[i] for i in follow], crowded or bool(first),
                                         deferred)
        pasts = [self._past(s, p) for s, p in zip(seqs, prompts, strict=True)]
        try:
            logits, kv = self.model.prefill(prompts, pasts)
        except Exception as e:  # noqa: BLE001 - contained: the rows that raise alone fail
            return self._split_prefill(seqs, e, crowded, deferred)
        self._computed = True
        self.stats.prefills += 1
        computed = [len(p) - (0 if past is None else past.length)
                    for p, past in zip(prompts, pasts, strict=True)]
        self.stats.prefill_tokens += sum(computed)
        self.stats.cached_tokens += sum(len(p) for p in prompts) - sum(computed)
        if self.cache is not None:
            for i, p in enumerate(prompts):
                self.cache.insert(p, kv, i)
        return [(seqs, logits, kv, computed)]

    def _split_prefill(self, seqs: list[_Seq], e: Exception, crowded: bool,
                       deferred: list[_Seq]
                       ) -> list[tuple[list[_Seq], torch.Tensor, KV, list[int]]]:
        """The prefill of ``seqs`` raised ``e``: prefill its halves apart. A single
        sequence that raises fails alone (``_fault``); one out of memory waits while
        others hold memory (``deferred``), and fails as too large otherwise."""
        oom = is_oom(e)
        if oom:
            self.stats.oom_splits += 1
        if len(seqs) > 1:
            if not oom:
                self.stats.fault_splits += 1
            half = len(seqs) // 2
            first = self._prefill(seqs[:half], crowded, deferred)
            return first + self._prefill(seqs[half:], crowded or bool(first), deferred)
        if not oom:
            self._fault(seqs[0], e)
        elif crowded:
            deferred.append(seqs[0])
        else:
            self._fail_alone(seqs[0], e)
        return []

    def _leaders(self, seqs: list[_Seq], prompts: list[list[int]]
                 ) -> tuple[list[int], list[int]]:
        """Rows admitted together whose prompts share a prefix that the cache does not
        hold yet (a batch's instruction, before its first row ran) would all compute
        it. Split them: leaders (the first row of each such prefix, and rows sharing
        nothing) are prefilled first, and the followers then take the prefix from the
        cache. Worth an extra forward pass only when the followers skip at least half
        of the tokens; otherwise (all, [])."""
        every = list(range(len(seqs)))
        if self.cache is None or len(seqs) < 2:
            return every, []
        block = self.cache.block
        lead: list[int] = []
        follow: list[int] = []
        saved = 0
        for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
            have = max(self.cache.cached(p), s.past.length if s.past is not None else 0)
            shared = max((len(os.path.commonprefix([p, prompts[j]])) for j in lead),
                         default=0)
            shared = min(shared // block * block, (len(p) - 1) // block * block)
            if shared - have >= block:
                follow.append(i)
                saved += shared - have
            else:
                lead.append(i)
        if not follow or 2 * saved < sum(len(p) for p in prompts):
            return every, []
        return lead, follow

    def _past(self, s: _Seq, prompt: list[int]) -> Past | None:
        """The longest state ``s`` can start its prefill of ``prompt`` from: its own
        earlier chunks, or the cache's longest prefix of it, whichever is longer."""
        hit = self.cache.lookup(prompt) if self.cache is not None else None
        own = s.past if s.past is not None and s.past.length < len(prompt) else None
        if own is None or (hit is not None and hit.length > own.length):
            return hit
        return own

    def _shed(self, prev: list[_Seq], e: Exception) -> list[_Seq]:
        """A decode step ran out of memory: keep the most urgent, oldest half of the
        batch and send the rest back to the queue (or fail a sequence that is alone);
        the holes go too."""
        live = [i for i, s in enumerate(prev) if not s.done]
        if len(live) == 1:
            self._fail_alone(prev[live[0]], e)
            self._kv = None
            return []
        assert self._kv is not None
        ranked = sorted(live, key=lambda i: (prev[i].priority, prev[i].order))
        keep = sorted(ranked[: len(live) // 2])
        self._preempt([prev[i] for i in ranked[len(live) // 2:]])
        self._kv = self._kv.select(keep).trim()
        self._fit_rows = len(keep)
        log.warning("out of memory at %d rows: %d sent back to the queue", len(live),
                    len(live) - len(keep))
        return [prev[i] for i in keep]

    def _fail_alone(self, s: _Seq, e: Exception) -> None:
        s.done = True
        self.stats.oom_failures += 1
        s.sink.fail(too_large(len(s.tokens()), e))

    def _grow_back(self, oom: bool) -> None:
        if oom or self._fit_rows is None:
            self._clean_steps = 0
            return
        self._clean_steps += 1
        if self._clean_steps >= GROW_EVERY:
            self._clean_steps = 0
            self._fit_rows += 1
            if self._fit_rows >= self.max_rows:
                self._fit_rows = None

    def _advance(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """Sample one token per row, deliver text, mark finished sequences; a row that
        cannot be sampled fails alone. Rows with a constraint first have the tokens that
        cannot continue a valid answer masked out."""
        if any(s.matcher is not None for s in seqs):
            self.grammars.mask(logits, [s.matcher for s in seqs])
        picks = choose(logits, [s.req for s in seqs], [s.gen for s in seqs],
                       [s.counts for s in seqs])
        for s, pick in zip(seqs, picks, strict=True):
            s.rows = max(s.rows, len(seqs))
            if isinstance(pick, Exception):
                self._fault(s, pick)
                continue
            if s.matcher is not None and not s.matcher.consume_token(pick.token):
                self._fault(s, RuntimeError(f"the constraint refused token {pick.token}: "
                                            f"{s.matcher.get_error()}"))
                continue
            self.stats.tokens += 1
            by = self.stats.tokens_by_priority
            by[s.priority] = by.get(s.priority, 0) + 1
            s.generated.append(pick.token)
            s.counts[pick.token] = s.counts.get(pick.token, 0) + 1
            if pick.logprob is not None:
                s.logprob_sum += pick.logprob
            self._deliver(s, pick)

    def _deliver(self, s: _Seq, pick: Pick) -> None:
        m = self.model
        if pick.token in m.eos_ids:
            return self._finish(s, FinishReason.STOP, drop_last=True)
        text = m.decode(s.generated)
        if s.req.logprobs is not None:
            s.pending.append(self._entry(pick, len(s.req.text) + s.text_len))
        s.text_len = len(text.removesuffix("\ufffd"))
        cut = stop_at(text, s.req.stop)
        if cut is not None:
            self._emit(s, text[:cut], final=True, cut=True)
            return self._finish(s, FinishReason.STOP)
        if s.matcher is not None and s.matcher.is_stopped():  # the answer is complete
            self._emit(s, text, final=True)
            return self._finish(s, FinishReason.STOP)
        if len(s.generated) >= s.req.max_new_tokens or s.pos + 1 >= m.context_length:
            self._emit(s, text, final=True)
            return self._finish(s, FinishReason.LENGTH)
        self._emit(s, text[: len(text) - holdback(text, s.req.stop)])
        return None

    def _emit(self, s: _Seq, text: str, final: bool = False, cut: bool = False) -> None:
        """Deliver the text past what was delivered and, with log probabilities, the
        tokens whose text starts in what is delivered (at the end: all of them, or at a
        stop string those that start before it)."""
        tokens: list[TokenLogprob] | None = None
        if s.req.logprobs is not None:
            limit = len(s.req.text) + len(text)
            k = len(s.pending) if final and not cut else next(
                (i for i, t in enumerate(s.pending) if t.offset >= limit), len(s.pending))
            tokens, s.pending = s.pending[:k], ([] if final else s.pending[k:])
        delta = text[s.emitted:] if len(text) > s.emitted else ""
        s.emitted = max(s.emitted, len(text))
        if isinstance(s.sink, _Branch):
            if delta or tokens:
                s.sink.piece(delta, tokens)
        elif delta:
            s.sink.delta(delta)

    def _finish(self, s: _Seq, reason: FinishReason, drop_last: bool = False) -> None:
        s.done = True
        if drop_last:
            self._emit(s, self.model.decode(s.generated[:-1]), final=True)
        self._finishing.append((s, reason))

    # Log probabilities and echoes ---------------------------------------------------------
    def texts(self) -> TokenTexts:
        if self._texts is None:
            self._texts = TokenTexts(self.model.tokenizer)
        return self._texts

    def _entry(self, pick: Pick, offset: int) -> TokenLogprob:
        texts = self.texts()
        text, raw = texts(pick.token)
        return TokenLogprob(text, raw, pick.logprob, [(*texts(t), lp) for t, lp in pick.top],
                            offset)

    def _start(self, s: _Seq, charged: list[tuple[_Seq, int]]) -> None:
        """A sequence's first admission: its sink is told it started. The first sequence
        of a request that echoes its prompt with log probabilities computes the prompt
        tokens' (a pass of its own over the prompt, charged to it); one that raises
        fails alone."""
        fan = s.sink.fan if isinstance(s.sink, _Branch) else None
        if fan is not None and fan.prompt is None and s.req.echo and s.req.logprobs is not None:
            try:
                fan.prompt = self._prompt_logprobs(s.req)
            except Exception as e:  # noqa: BLE001 - this request's, and its only
                self._fault(s, e)
                return
            charged.append((s, len(s.req.prompt)))
        s.sink.start()

    def _prompt_logprobs(self, req: GenRequest) -> list[TokenLogprob]:
        """Each prompt token with its log probability given the ones before it (the
        first has none), adjusted as generated tokens are (``logit_bias``, temperature;
        nothing generated yet to penalize), and its offset in the prompt's text."""
        texts, ids = self.texts(), req.prompt
        offsets = texts.offsets(ids)
        out = [TokenLogprob(*texts(ids[0]), None, None, offsets[0])]
        for start, logits in prompt_scores(self.model, ids):
            lp = log_probs(adjusted(logits, req, None), req.temperature)
            for j in range(lp.shape[0]):
                at = start + j + 1
                tok = ids[at]
                out.append(TokenLogprob(*texts(tok), float(lp[j, tok]),
                                        [(*texts(t), v) for t, v in
                                         top_of(lp[j], req.logprobs or 0)], offsets[at]))
        return out

    def _abandon(self, s: _Seq) -> None:
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

    def _live(self) -> list[_Seq]:
        return [s for s in self._running if not s.done]

    def _join(self, prev: list[_Seq], joined: list[_Seq], new_kv: KV) -> None:
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


S = TypeVar("S", bound="Scored")


def sequences(req: GenRequest, sink: Sink, new: Callable[[Sink, int | None], S]) -> list[S]:
    """The sequences ``req`` runs as, each made by ``new(its sink, its seed)``: one, or
    when it fans out its ``best_of``, each with a branch of a ``_Fan`` as its sink and
    seeded seed + i (either engine)."""
    if not req.fans():
        return [new(sink, req.seed)]
    fan = _Fan(cast(ChoiceSink, sink), req)
    out = []
    for b in fan.branches:
        seq = new(b, None if req.seed is None else req.seed + b.index)
        b.seq = seq
        out.append(seq)
    return out


class _Fan:
    """The ``best_of`` sequences of one request that fans out, told to its sink as
    choices (see the module's docstring). All its calls come from the engine thread."""

    def __init__(self, sink: ChoiceSink, req: GenRequest) -> None:
        self.sink, self.req = sink, req
        self.branches = [_Branch(self, i) for i in range(req.best_of)]
        self.ranked = req.best_of > req.n  # held back until the n best are known
        self.prompt: list[TokenLogprob] | None = None  # an echo's tokens, computed once
        self.started = self.failed = self.over = self.cut_short = False

    def start(self, b: _Branch) -> None:
        if not self.started:
            self.started = True
            self.sink.start()
        b.began = True
        if self.req.echo:
            self.piece(b, self.req.text, None if self.req.logprobs is None
                       else list(self.prompt or []))

    def piece(self, b: _Branch, text: str, tokens: list[TokenLogprob] | None) -> None:
        if self.ranked:
            b.held.add(text, tokens)
        elif not (self.failed or self.over):
            self.sink.piece(b.index, text, tokens)

    def done(self, b: _Branch, reason: FinishReason, usage: Usage) -> None:
        b.settled, b.usage, b.held.reason = True, usage, str(reason)
        if not (self.ranked or self.failed or self.over):
            self.sink.choice_end(b.index, str(reason))
        self._check()

    def fail(self, b: _Branch, e: Exception) -> None:
        b.settled = True
        if not (self.failed or self.over):
            self.failed = True
            self.sink.fail(e)

    def gone(self, b: _Branch, usage: Usage | None) -> None:
        """``b`` was dropped (its caller went away): with its usage if it ran."""
        b.settled, b.usage, self.cut_short = True, usage, True
        self._check()

    def cancelled(self, b: _Branch) -> bool:
        c = self.failed or self.over or self.sink.cancelled()
        if c and not b.began and not b.settled:  # never started: dropped from the queue now
            self.gone(b, None)
        return c

    def usage(self) -> Usage:
        used = [b.usage for b in self.branches if b.usage is not None]
        return Usage(len(self.req.prompt), sum(u.completion_tokens for u in used),
                     max((u.batch_rows for u in used), default=0),
                     sum(u.accelerator_s for u in used),
                     max((u.cached_tokens for u in used), default=0))

    def _check(self) -> None:
        if self.failed or self.over or not all(b.settled for b in self.branches):
            return
        self.over = True
        if self.cut_short:
            abandoned = getattr(self.sink, "abandoned", None)
            if abandoned is not None:
                abandoned(self.usage())
            return
        chosen = self.branches
        if self.ranked:  # OpenAI's "best": the highest log probability per token
            chosen = sorted(self.branches, key=lambda b: -b.mean_logprob())[: self.req.n]
            for i, b in enumerate(chosen):
                self.sink.piece(i, b.held.text, b.held.tokens)
                self.sink.choice_end(i, b.held.reason)
        self.sink.finish(FinishReason(chosen[0].held.reason), self.usage())


class Scored(Protocol):
    """What ``best_of``'s ranking reads of a branch's sequence, on either engine."""

    logprob_sum: float
    generated: list[int]


class _Branch:
    """The sink of one sequence of a ``_Fan``."""

    def __init__(self, fan: _Fan, index: int) -> None:
        self.fan, self.index = fan, index
        self.seq: Scored | None = None
        self.began = self.settled = False
        self.usage: Usage | None = None
        self.held = Choice(index)  # its choice so far (the ranked are replayed from it)

    def mean_logprob(self) -> float:
        s = self.seq
        return s.logprob_sum / len(s.generated) if s is not None and s.generated else -math.inf

    def start(self) -> None:
        self.fan.start(self)

    def delta(self, text: str) -> None:
        self.fan.piece(self, text, None)

    def piece(self, text: str, tokens: list[TokenLogprob] | None) -> None:
        self.fan.piece(self, text, tokens)

    def finish(self, reason: FinishReason, usage: Usage) -> None:
        self.fan.done(self, reason, usage)

    def fail(self, error: Exception) -> None:
        self.fan.fail(self, error)

    def abandoned(self, usage: Usage) -> None:
        self.fan.gone(self, usage)

    def cancelled(self) -> bool:
        return self.fan.cancelled(self)


# Token texts ---------------------------------------------------------------------------------


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's bytes_to_unicode), character to byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: b for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


BYTE_OF = _byte_decoder()
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTexts:
    """A token's text and UTF-8 bytes as the log probabilities report them: the bytes
    the tokenizer maps it to (byte-level BPE's alphabet, SentencePiece's ``▁`` and
    ``<0xNN>`` byte pieces; else its decoded text), and the text of those bytes (a
    token that ends inside a character shows the torn bytes escaped: ``\\xe2``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = "ByteLevel" in repr(decoder)
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, tid: int) -> tuple[str, list[int]]:
        hit = self.cache.get(tid)
        if hit is None:
            raw = self.raw(tid)
            hit = self.cache[tid] = (raw.decode("utf-8", "backslashreplace"), list(raw))
        return hit

    def raw(self, tid: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(tid)
        if isinstance(piece, str):
            if self.byte_level and all(c in BYTE_OF for c in piece):
                return bytes(BYTE_OF[c] for c in piece)
            if m := BYTE_PIECE.fullmatch(piece):
                return bytes([int(m.group(1), 16)])
            if "\u2581" in piece:
                return piece.replace("\u2581", " ").encode()
        return str(self.tokenizer.decode([tid])).encode()

    def offsets(self, ids: list[int]) -> list[int]:
        """Where each token's text starts in the text of ``ids`` (characters)."""
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        out, n = [], 0
        for t in ids:
            out.append(n)
            n += len(dec.decode(bytes(self(t)[1])))
        return out


@torch.inference_mode()
def prompt_scores(model: ChatModel, ids: list[int], chunk: int = 128
                  ) -> Iterator[tuple[int, torch.Tensor]]:
    """The model's scores at every position of ``ids`` but the last, ``chunk`` positions
    at a time: (first position, scores [positions, vocab]); row j predicts token
    first + j + 1. The prefill keeps only the last position's, so an echo with log
    probabilities runs this pass of its own."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for start in range(0, len(ids) - 1, chunk):
        part = ids[start: min(start + chunk, len(ids) - 1)]
        x = torch.tensor([part], dtype=torch.long, device=model.device)
        pos = torch.arange(start, start + len(part), device=model.device).unsqueeze(0)
        mask = torch.ones((1, start + len(part)), dtype=torch.long, device=model.device)
        logits, cache = model.forward(cache, input_ids=x, attention_mask=mask,
                                      position_ids=pos)
        yield start, logits[0].float()


class Grammars:
    """Structured outputs on this engine (jobs.protocol.structured): llguidance matchers
    over the model's tokenizer, and the mask of each step's constrained rows."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def matcher(self, c: Constraint) -> Any:
        import llguidance

        return llguidance.LLMatcher(self.tokenizer(), c.grammar())

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                cfg = getattr(getattr(self.model, "model", None), "config", None)
                tok: Any = self.model.tokenizer
                self._tokenizer = llguidance.hf.from_tokenizer(
                    tok, n_vocab=getattr(cfg, "vocab_size", None))
            return self._tokenizer

    @staticmethod
    def mask(logits: torch.Tensor, matchers: list[Any]) -> None:
        """Set the scores of the tokens each row's matcher forbids to -inf, in place
        (a row without a matcher is left as it is)."""
        import llguidance.torch as lt

        bits = lt.allocate_token_bitmask(len(matchers), logits.shape[-1])
        for i, m in enumerate(matchers):
            if m is not None:
                lt.fill_next_token_bitmask(m, bits, i)
        lt.apply_token_bitmask_inplace(logits, bits.to(logits.device))


class Collect:
    """A sink that gathers the whole answer (batch shards and jobs): its ``choices``
    (one unless the request fanned out), ``text`` and ``reason`` the first's."""

    def __init__(self, on_done: Callable[[Collect], object] | None = None) -> None:
        self.choices: list[Choice] = [Choice(0)]
        self.parts: list[str] = self.choices[0].parts
        self.reason: str = ""
        self.usage = Usage(0, 0, 0)
        self.error: Exception | None = None
        self.event = threading.Event()
        self.on_done = on_done
        self._cancelled = False

    def start(self) -> None:
        return None

    def delta(self, text: str) -> None:
        self.parts.append(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        self._choice(index).add(text, tokens)

    def choice_end(self, index: int, reason: str) -> None:
        self._choice(index).reason = reason

    def _choice(self, index: int) -> Choice:
        while len(self.choices) <= index:
            self.choices.append(Choice(len(self.choices)))
        return self.choices[index]

    def finish(self, reason: FinishReason, usage: Usage) -> None:
        self.reason, self.usage = reason, usage
        self.choices[0].reason = self.choices[0].reason or str(reason)
        self._done()

    def fail(self, error: Exception) -> None:
        self.error = error
        self._done()

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled

    def _done(self) -> None:
        self.event.set()
        if self.on_done is not None:
            self.on_done(self)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def result(self, timeout: float | None = None) -> Any:
        if not self.event.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        if self.error is not None:
            raise self.error
        return self
