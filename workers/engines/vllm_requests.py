"""Requests on the vLLM engine: each sequence's state (``VllmRequest``), the
``SamplingParams`` it is added with (``sampling_params``: structured outputs by
llguidance; an answer that broke it is an error: ``VllmRequest.failed``), and vLLM's
log probabilities read back as the API reports them: vLLM's
processed ones (after penalties, bias, temperature and top-p), each token's text and
bytes as the transformers engine reports them; a token that top-p excluded has no
finite log probability and is reported at ``FLOOR``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workers.engines.request import GenRequest
from workers.engines.responses import TokenLogprob
from workers.engines.sampling import FLOOR  # a token the sampler excluded (OpenAI's floor)
from workers.engines.sinks import Sink, Usage
from workers.engines.token_texts import TokenTexts


@dataclass
class VllmRequest:
    """One vLLM request: a request's sequence, with what was delivered of it."""

    id: str
    req: GenRequest
    sink: Sink
    priority: int
    order: int
    seed: int | None
    generated: list[int] = field(default_factory=list)
    logprob_sum: float = 0.0  # of the sampled tokens, when scored (best_of's ranking)
    chars: int = 0  # characters of the text of ``generated`` (log probabilities' offsets)
    text: int = 0  # characters delivered
    decoder: Any = None  # the incremental UTF-8 decoder of the tokens' bytes
    cached: int = 0
    rows: int = 0
    accel_s: float = 0.0
    added: bool = False
    started: bool = False
    done: bool = False
    answer: list[str] = field(default_factory=list)  # its text, under a constraint
    stop_string: bool = False  # it ended at one of its stop strings

    def usage(self) -> Usage:
        return Usage(len(self.req.prompt), len(self.generated), self.rows, self.accel_s,
                     self.cached)

    def track(self, text: str, stop_reason: Any) -> None:
        """A step's new text and vLLM's stop reason (a stop string: a str)."""
        if self.req.constraint is not None:
            self.answer.append(text)
        self.stop_string = isinstance(stop_reason, str)

    def failed(self, reason: str | None) -> Exception | None:
        """The error an ended answer is, if any: vLLM ends one whose grammar refused a
        token with "error"; a grammar that fails while computing a mask leaves only the
        end token, so an answer under a constraint that ended (not at a stop string, not
        cut by its length) must be a whole answer of its grammar."""
        if reason == "error":
            return RuntimeError("the engine ended the answer with an error (its grammar "
                                "refused a token)" if self.req.constraint is not None
                                else "the engine ended the answer with an error")
        c = self.req.constraint
        if c is None or reason != "stop" or self.stop_string:
            return None
        why = c.broken("".join(self.answer))
        return RuntimeError(f"the answer broke its constraint: {why}") if why else None


def sampling_params(r: VllmRequest) -> Any:
    """The ``SamplingParams`` vLLM runs ``r`` with: its sampling, penalties, bias,
    stop strings, log probabilities and constraint, the new text and tokens of each
    step (``DELTA``)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    q = r.req
    logprobs = q.logprobs if q.logprobs is not None else 0 if q.scored() else None
    c = q.constraint
    structured = (None if c is None else StructuredOutputsParams(grammar=c.lark)
                  if c.lark is not None else StructuredOutputsParams(json=c.schema))
    return SamplingParams(
        n=1, temperature=q.temperature, top_p=q.top_p, seed=r.seed,
        stop=list(q.stop) or None, max_tokens=q.max_new_tokens - len(q.resume),
        presence_penalty=q.presence_penalty, frequency_penalty=q.frequency_penalty,
        logit_bias=dict(q.logit_bias) or None, logprobs=logprobs,
        prompt_logprobs=q.logprobs if q.echo and q.logprobs is not None else None,
        output_kind=RequestOutputKind.DELTA, skip_special_tokens=True,
        structured_outputs=structured)


def token_logprob(texts: TokenTexts, tid: int, lp: float | None,
                  entry: dict[int, Any] | None, req: GenRequest, offset: int
                  ) -> TokenLogprob:
    """A generated token as log probabilities report it, with its most likely
    alternatives."""
    text, raw = texts(tid)
    return TokenLogprob(text, raw, FLOOR if lp is None else lp,
                        top_logprobs(texts, entry, req.logprobs or 0), offset)


def top_logprobs(texts: TokenTexts, entry: dict[int, Any] | None, k: int
                 ) -> list[tuple[str, list[int], float]]:
    ranked = sorted((entry or {}).items(), key=lambda kv: kv[1].rank or math.inf)[:k]
    return [(*texts(t), finite(v.logprob) or FLOOR) for t, v in ranked]


def prompt_logprobs(texts: TokenTexts, req: GenRequest, scores: list[Any] | None
                    ) -> list[TokenLogprob]:
    """Each prompt token with its log probability given the ones before it (the
    first has none), its most likely alternatives and its offset in the prompt."""
    ids = req.prompt
    offsets = texts.offsets(ids)
    out = [TokenLogprob(*texts(ids[0]), None, None, offsets[0])]
    for at in range(1, len(ids)):
        entry = scores[at] if scores is not None and at < len(scores) else None
        tok = ids[at]
        lp = finite(entry[tok].logprob) if entry and tok in entry else None
        out.append(TokenLogprob(*texts(tok), FLOOR if lp is None else lp,
                                top_logprobs(texts, entry, req.logprobs or 0), offsets[at]))
    return out


def finite(v: float | None) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None
