"""Sampling: the next token of every row of a step, and where stop strings cut the text.

Called by the generation engine each step, on its thread.
"""

from __future__ import annotations

import torch

from workers.generation_request import GenRequest


def sample(logits: torch.Tensor, reqs: list[GenRequest],
           gens: list[torch.Generator | None]) -> list[int]:
    """Greedy rows by argmax in one call; sampled rows with temperature and top-p."""
    out = logits.argmax(-1).tolist()
    for i, r in enumerate(reqs):
        if r.temperature <= 0:
            continue
        probs = torch.softmax(logits[i].cpu() / r.temperature, -1)
        if r.top_p < 1:
            sp, si = probs.sort(descending=True)
            keep = sp.cumsum(-1) - sp < r.top_p
            probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
        out[i] = int(torch.multinomial(probs, 1, generator=gens[i]).item())
    return [int(x) for x in out]


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
