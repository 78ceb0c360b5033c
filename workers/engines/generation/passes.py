"""Forward passes on the transformers generation engine: the prefill of the sequences a
step admits (from their own earlier chunks or the prefix cache's longest prefix) and the
decode of the running rows, and what happens when one raises.

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
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from workers.engines.embeddings import count_split, is_oom, too_large
from workers.engines.generation.delivery import Delivery
from workers.engines.generation.rows import RunningRows
from workers.engines.generation.sequence import Seq
from workers.engines.prefix_cache import PrefixCache
from workers.models.chat import KV, Past

log = logging.getLogger("inferq.generation")
GROW_EVERY = 8  # clean steps per row the out-of-memory cap grows back


class Passes(Delivery, RunningRows):
    """The forward passes of ``GenerationEngine``, which sets up their state."""

    cache: PrefixCache | None
    max_rows: int
    _fit_rows: int | None  # rows that fitted when memory last ran out
    _clean_steps: int
    _computed: bool  # a forward pass of this step computed some rows

    def _decode(self, prev: list[Seq], charged: list[tuple[Seq, int]]
                ) -> tuple[list[Seq], bool]:
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
    def _contain_decode(self, prev: list[Seq], live: list[int], e: Exception
                        ) -> tuple[list[Seq], torch.Tensor, KV] | None:
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

    def _decode_rows(self, rows: list[Seq], kv: KV) -> tuple[torch.Tensor, KV]:
        logits, new = self.model.decode_step([s.generated[-1] for s in rows],
                                             [s.pos for s in rows], kv)
        self._computed = True
        return logits, new

    def _bisect_decode(self, rows: list[Seq], kv: KV, e: Exception
                       ) -> list[tuple[list[Seq], torch.Tensor, KV]]:
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
        out: list[tuple[list[Seq], torch.Tensor, KV]] = []
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

    def _preempt(self, seqs: list[Seq]) -> None:
        for s in seqs:
            self._enqueue(s)
        self.stats.preemptions += len(seqs)

    def _prefill(self, seqs: list[Seq], crowded: bool, deferred: list[Seq]
                 ) -> list[tuple[list[Seq], torch.Tensor, KV, list[int]]]:
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

    def _split_prefill(self, seqs: list[Seq], e: Exception, crowded: bool,
                       deferred: list[Seq]
                       ) -> list[tuple[list[Seq], torch.Tensor, KV, list[int]]]:
        """The prefill of ``seqs`` raised ``e``: prefill its halves apart. A single
        sequence that raises fails alone (``_fault``); one out of memory waits while
        others hold memory (``deferred``), and fails as too large otherwise."""
        oom = count_split(self.stats, e, len(seqs))
        if len(seqs) > 1:
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

    def _leaders(self, seqs: list[Seq], prompts: list[list[int]]
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

    def _past(self, s: Seq, prompt: list[int]) -> Past | None:
        """The longest state ``s`` can start its prefill of ``prompt`` from: its own
        earlier chunks, or the cache's longest prefix of it, whichever is longer."""
        hit = self.cache.lookup(prompt) if self.cache is not None else None
        own = s.past if s.past is not None and s.past.length < len(prompt) else None
        if own is None or (hit is not None and hit.length > own.length):
            return hit
        return own

    def _shed(self, prev: list[Seq], e: Exception) -> list[Seq]:
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

    def _fail_alone(self, s: Seq, e: Exception) -> None:
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
