"""A request of several choices on either engine.

A request of several choices (``n``, ``best_of``), or with log probabilities or an
echo, is ``best_of`` sequences submitted together (``Fan``): each is a sequence like
any other (scheduled, preempted, bisected alone), except that on the transformers engine
the ones that start in one step compute their prompt once (``twins``: its state is
copied to each), and the request's sink is told of them as choices:
``piece(index, text, tokens)`` as they are generated (or, when best_of > n, the n of
highest mean log probability once all are done), ``choice_end(index, reason)`` per
choice, then ``finish`` with the usage of them all. A sequence that fails fails its request
(the others are dropped); it never fails another request. With seed s, sequence i
draws from its own generator seeded s + i.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, cast

from workers.engines.request import GenRequest
from workers.engines.responses import Choice, TokenLogprob
from workers.engines.sinks import ChoiceSink, FinishReason, Sink, Usage

S = TypeVar("S", bound="Scored")


def sequences(req: GenRequest, sink: Sink, new: Callable[[Sink, int | None], S]) -> list[S]:
    """The sequences ``req`` runs as, each made by ``new(its sink, its seed)``: one, or
    when it fans out its ``best_of``, each with a branch of a ``Fan`` as its sink and
    seeded seed + i (either engine)."""
    if not req.fans():
        seq = new(sink, req.seed)
        seq.generated.extend(req.resume)  # continued as if it had generated them
        follow = getattr(sink, "follow", None)
        if follow is not None:  # the sink reads what it generated so far
            follow(seq.generated)
        return [seq]
    fan = Fan(cast(ChoiceSink, sink), req)
    out = []
    for b in fan.branches:
        seq = new(b, None if req.seed is None else req.seed + b.index)
        b.seq = seq
        out.append(seq)
    return out


class Fan:
    """The ``best_of`` sequences of one request that fans out, told to its sink as
    choices (see the module's docstring). All its calls come from the engine thread."""

    def __init__(self, sink: ChoiceSink, req: GenRequest) -> None:
        self.sink, self.req = sink, req
        self.branches = [Branch(self, i) for i in range(req.best_of)]
        self.ranked = req.best_of > req.n  # held back until the n best are known
        self.prompt: list[TokenLogprob] | None = None  # an echo's tokens, computed once
        self.started = self.failed = self.over = self.cut_short = False

    def start(self, b: Branch) -> None:
        if not self.started:
            self.started = True
            self.sink.start()
        b.began = True
        if self.req.echo:
            self.piece(b, self.req.text, None if self.req.logprobs is None
                       else list(self.prompt or []))

    def piece(self, b: Branch, text: str, tokens: list[TokenLogprob] | None) -> None:
        if self.ranked:
            b.held.add(text, tokens)
        elif not (self.failed or self.over):
            self.sink.piece(b.index, text, tokens)

    def done(self, b: Branch, reason: FinishReason, usage: Usage) -> None:
        b.settled, b.usage, b.held.reason = True, usage, str(reason)
        if not (self.ranked or self.failed or self.over):
            self.sink.choice_end(b.index, str(reason))
        self._check()

    def fail(self, b: Branch, e: Exception) -> None:
        b.settled = True
        if not (self.failed or self.over):
            self.failed = True
            self.sink.fail(e)

    def gone(self, b: Branch, usage: Usage | None) -> None:
        """``b`` was dropped (its caller went away): with its usage if it ran."""
        b.settled, b.usage, self.cut_short = True, usage, True
        self._check()

    def cancelled(self, b: Branch) -> bool:
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


def twins(seqs: Sequence[Starting]) -> dict[int, list[int]]:
    """Sequences of one request that start together from its prompt alone compute it
    once: for the index of each such sequence's first in ``seqs``, the indices of the
    later ones, which take its result (its logits and key/value state) as theirs."""
    first: dict[int, int] = {}
    out: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        if s.generated or s.past is not None or s.chunk_to is not None:
            continue  # resuming, or a chunk of a chunked prefill: its own state
        j = first.setdefault(id(s.req), i)
        if j != i:
            out.setdefault(j, []).append(i)
    return out


class Scored(Protocol):
    """What ``best_of``'s ranking reads of a branch's sequence, on either engine."""

    logprob_sum: float
    generated: list[int]


class Starting(Protocol):
    """What ``twins`` reads of a sequence about to be prefilled."""

    @property
    def generated(self) -> list[int]: ...
    @property
    def past(self) -> object: ...
    @property
    def chunk_to(self) -> int | None: ...
    @property
    def req(self) -> GenRequest: ...


class Branch:
    """The sink of one sequence of a ``Fan``."""

    def __init__(self, fan: Fan, index: int) -> None:
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
