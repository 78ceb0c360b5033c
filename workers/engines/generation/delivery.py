"""Sampling and delivery on the transformers generation engine: one token sampled per
row (the tokens a row's constraint forbids masked out first), its text delivered to the
sequence's sink with what may start a stop string held back, the sequence's end (a stop
or its length) and, when asked for, each token's log probability; an echo's prompt
tokens are scored by a pass of their own (``prompt_scores``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

from workers.engines.fanout import Branch
from workers.engines.generation.grammars import Grammars
from workers.engines.generation.sequence import Seq
from workers.engines.request import GenRequest
from workers.engines.responses import TokenLogprob
from workers.engines.sampling import Pick, adjusted, choose, holdback, log_probs, stop_at, top_of
from workers.engines.sinks import FinishReason
from workers.engines.stats import GenStats
from workers.engines.token_texts import TokenTexts
from workers.models.chat import ChatModel

log = logging.getLogger("inferq.generation")


class Delivery:
    """What ``GenerationEngine`` does with a step's scores, which sets up its state."""

    model: ChatModel
    stats: GenStats
    grammars: Grammars
    _texts: TokenTexts | None
    _finishing: list[tuple[Seq, FinishReason]]  # told at the step's end
    _faults: list[tuple[Seq, Exception]]  # failed alone; told at its end

    def _fault(self, s: Seq, e: Exception) -> None:
        """``s`` raised alone (its forward pass or its sampling): it leaves the batch
        now; its sink is told at the step's end, which shows whether the step computed
        other rows (``blame``)."""
        log.warning("a sequence failed alone: %s: %s", type(e).__name__, e)
        s.done = True
        self.stats.faults += 1
        self._faults.append((s, e))

    def _advance(self, seqs: list[Seq], logits: torch.Tensor) -> None:
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

    def _deliver(self, s: Seq, pick: Pick) -> None:
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
            if s.matcher.is_error():  # (or its grammar failed: an error, never a "stop")
                self._fault(s, RuntimeError(f"the constraint failed: {s.matcher.get_error()}"))
                return None
            self._emit(s, text, final=True)
            return self._finish(s, FinishReason.STOP)
        if len(s.generated) >= s.req.max_new_tokens or s.pos + 1 >= m.context_length:
            self._emit(s, text, final=True)
            return self._finish(s, FinishReason.LENGTH)
        self._emit(s, text[: len(text) - holdback(text, s.req.stop)])
        return None

    def _emit(self, s: Seq, text: str, final: bool = False, cut: bool = False) -> None:
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
        if isinstance(s.sink, Branch):
            if delta or tokens:
                s.sink.piece(delta, tokens)
        elif delta:
            s.sink.delta(delta)

    def _finish(self, s: Seq, reason: FinishReason, drop_last: bool = False) -> None:
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

    def _start(self, s: Seq, charged: list[tuple[Seq, int]]) -> None:
        """A sequence's first admission: its sink is told it started. The first sequence
        of a request that echoes its prompt with log probabilities computes the prompt
        tokens' (a pass of its own over the prompt, charged to it); one that raises
        fails alone."""
        fan = s.sink.fan if isinstance(s.sink, Branch) else None
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
