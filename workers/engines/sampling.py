"""Sampling: the next token of every row of a step, and where stop strings cut the text.

Called by the generation engine each step, on its thread. No temperature or top-p in
the accepted ranges (temperature 0..2, top-p in (0, 1], subnormal values included)
can make a row's weights inf or NaN: they are computed in float64 from the scores
less their maximum, so the top token's weight is exp(0) = 1 at any temperature, and
top-p always keeps the top token. A row that still cannot be sampled (its scores
hold no number) gets its exception in place of a token and fails alone.

Before sampling a row's scores are adjusted as OpenAI describes (``adjusted``): each
token's logit less ``presence_penalty`` if the token was generated in this sequence so
far and less ``frequency_penalty`` times the number of times it was, plus its
``logit_bias``. Penalties (-2..2) times counts (at most the context) and biases
(-100..100) are finite in float64, and a masked (-inf) score stays masked: a row biased
-100 everywhere keeps its distribution (only differences count).

Log probabilities (``log_probs``) are the log-softmax of the adjusted scores divided by
the temperature (1 at temperature 0, where sampling is greedy): the distribution the
token was drawn from, before top-p truncation (which would make the tokens it drops
-inf). Computed like the weights, from the scores less their maximum, so the log of the
normaliser is finite; a token too unlikely to tell is ``FLOOR`` (-9999, as OpenAI
reports it), never -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from workers.engines.request import GenRequest

NO_SCORE = "the model's scores for the next token hold no finite value"
FLOOR = -9999.0  # the log probability of a token too unlikely to tell (OpenAI's value)


@dataclass
class Pick:
    """A row's next token; with ``logprob`` (its log probability) when the request
    scores its tokens, and ``top``: the request's ``logprobs`` most likely tokens at
    this position with theirs, most likely first."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


def sample(logits: torch.Tensor, reqs: list[GenRequest],
           gens: list[torch.Generator | None]) -> list[int | Exception]:
    """Each row's next token (see ``choose``), or the exception that row raised."""
    return [p if isinstance(p, Exception) else p.token for p in choose(logits, reqs, gens)]


def choose(logits: torch.Tensor, reqs: list[GenRequest], gens: list[torch.Generator | None],
           counts: list[dict[int, int]] | None = None) -> list[Pick | Exception]:
    """Greedy rows of plain requests by argmax in one call; the others from their
    adjusted scores (``counts``: per row, the tokens generated so far and how often),
    with temperature and top-p, and their log probabilities where asked for."""
    scores = torch.nan_to_num(logits, nan=-math.inf, neginf=-math.inf)
    finite = torch.isfinite(scores).any(-1)
    picks = torch.where(finite, scores.argmax(-1), -1).tolist()
    out: list[Pick | Exception] = []
    for i, r in enumerate(reqs):
        try:
            if picks[i] < 0:
                raise ValueError(NO_SCORE)
            if r.temperature == 0 and not r.processed() and not r.scored():
                out.append(Pick(int(picks[i])))
                continue
            z = adjusted(logits[i], r, counts[i] if counts is not None else None)
            tok = (int(z.argmax()) if r.temperature == 0
                   else _draw(z, r.temperature, r.top_p, gens[i]))
            pick = Pick(tok)
            if r.scored():
                lp = log_probs(z, r.temperature)
                pick.logprob = float(lp[tok])
                pick.top = top_of(lp, r.logprobs or 0)
            out.append(pick)
        except Exception as e:  # noqa: BLE001 - this row's, and this row's only
            out.append(e)
    return out


def adjusted(scores: torch.Tensor, req: GenRequest, counts: dict[int, int] | None
             ) -> torch.Tensor:
    """``scores`` (a row, or rows along the last dimension) in float64 on the CPU, NaN
    as -inf, less the penalties of the tokens in ``counts`` and plus ``logit_bias``."""
    z = torch.nan_to_num(scores.detach().to("cpu", torch.float64), nan=-math.inf,
                         neginf=-math.inf)
    if counts and (req.presence_penalty or req.frequency_penalty):
        ids = torch.tensor(list(counts), dtype=torch.long)
        seen = torch.tensor(list(counts.values()), dtype=torch.float64)
        z[..., ids] -= req.frequency_penalty * seen + req.presence_penalty
    if req.logit_bias:
        ids = torch.tensor(list(req.logit_bias), dtype=torch.long)
        z[..., ids] += torch.tensor(list(req.logit_bias.values()), dtype=torch.float64)
    return z


def log_probs(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """The log-softmax of adjusted scores ``z`` at ``temperature`` (1 when 0) along the
    last dimension, each at least ``FLOOR``: never inf or NaN while a score is finite."""
    t = temperature if temperature > 0 else 1.0
    w = (z - z.max(-1, keepdim=True).values) / t  # <= 0, the top score's exactly 0
    lp = w - torch.logsumexp(w, -1, keepdim=True)
    return torch.nan_to_num(lp, nan=FLOOR).clamp(min=FLOOR)  # NaN: a row with no score


def top_of(lp: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of a row of log probabilities, most likely first."""
    k = min(k, lp.shape[-1])
    if k <= 0:
        return []
    values, ids = lp.topk(k)
    # a token a constraint forbids has no finite log probability: OpenAI's floor
    return list(zip(ids.tolist(), values.clamp(min=FLOOR).tolist(), strict=True))


def draw(scores: torch.Tensor, temperature: float, top_p: float,
         gen: torch.Generator | None) -> int:
    """One token from a row's ``scores`` at ``temperature`` (> 0) within ``top_p``."""
    z = torch.nan_to_num(scores.detach().to("cpu", torch.float64), nan=-math.inf,
                         neginf=-math.inf)
    return _draw(z, temperature, top_p, gen)


def _draw(z: torch.Tensor, temperature: float, top_p: float,
          gen: torch.Generator | None) -> int:
    """``draw`` from scores already in float64 with NaN as -inf."""
    top = float(z.max())
    if not math.isfinite(top):
        raise ValueError(NO_SCORE)
    weights = ((z - top) / temperature).exp()  # in [0, 1], the top token's exactly 1
    probs = weights / weights.sum()
    if top_p < 1:
        sp, si = probs.sort(descending=True)
        keep = sp.cumsum(-1) - sp < top_p
        keep[0] = True  # the top token, however small top_p
        probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
    return int(torch.multinomial(probs, 1, generator=gen).item())


def stop_at(text: str, stops: list[str]) -> int | None:
    """Where the text ends at its first stop string, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def holdback(text: str, stops: list[str]) -> int:
    """Characters to hold back: a possible start of a stop string, or a torn UTF-8 char."""
    n = 1 if text.endswith("\ufffd") else 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                n = max(n, k)
                break
    return n
