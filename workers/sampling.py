"""Sampling: the next token of every row of a step, and where stop strings cut the text.

Called by the generation engine each step, on its thread. No temperature or top-p in
the accepted ranges (temperature 0..2, top-p in (0, 1], subnormal values included)
can make a row's weights inf or NaN: they are computed in float64 from the scores
less their maximum, so the top token's weight is exp(0) = 1 at any temperature, and
top-p always keeps the top token. A row that still cannot be sampled (its scores
hold no number) gets its exception in place of a token and fails alone.
"""

from __future__ import annotations

import math

import torch

from workers.generation_request import GenRequest

NO_SCORE = "the model's scores for the next token hold no finite value"


def sample(logits: torch.Tensor, reqs: list[GenRequest],
           gens: list[torch.Generator | None]) -> list[int | Exception]:
    """Greedy rows by argmax in one call; sampled rows with temperature and top-p."""
    scores = torch.nan_to_num(logits, nan=-math.inf, neginf=-math.inf)
    finite = torch.isfinite(scores).any(-1)
    picks = torch.where(finite, scores.argmax(-1), -1).tolist()
    out: list[int | Exception] = []
    for i, r in enumerate(reqs):
        try:
            if picks[i] < 0:
                raise ValueError(NO_SCORE)
            out.append(draw(logits[i], r.temperature, r.top_p, gens[i])
                       if r.temperature > 0 else int(picks[i]))
        except Exception as e:  # noqa: BLE001 - this row's, and this row's only
            out.append(e)
    return out


def draw(scores: torch.Tensor, temperature: float, top_p: float,
         gen: torch.Generator | None) -> int:
    """One token from a row's ``scores`` at ``temperature`` (> 0) within ``top_p``."""
    z = torch.nan_to_num(scores.detach().to("cpu", torch.float64), nan=-math.inf,
                         neginf=-math.inf)
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
