"""Sampling (workers/sampling.py) over the extremes of the accepted parameters: no
temperature in 0..2 and no top-p in (0, 1], subnormal values included, may make a row
unsampleable, and a row that cannot be sampled fails alone."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.generation_request import GenRequest
from workers.sampling import NO_SCORE, draw, sample

EXTREMES = [0.0, 5e-324, 1e-310, 1e-300, 1e-45, 1e-30, 1e-8, 0.5, 1.0, 2.0]
TOP_PS = [5e-324, 1e-300, 1e-45, 1e-8, 0.5, 0.999999, 1.0]


def request(temperature: float, top_p: float = 1.0) -> GenRequest:
    return GenRequest(prompt=[1], max_new_tokens=1, temperature=temperature, top_p=top_p)


def scores(seed: int, vocab: int = 300, scale: float = 30.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=g) * scale


@pytest.mark.parametrize("temperature", EXTREMES)
@pytest.mark.parametrize("top_p", TOP_PS)
def test_every_accepted_temperature_and_top_p_samples(temperature: float, top_p: float) -> None:
    logits = torch.stack([scores(1), scores(2, scale=3e4), scores(3, scale=1e-6)])
    reqs = [request(temperature, top_p)] * 3
    gens = [torch.Generator().manual_seed(7) for _ in reqs]
    picks = sample(logits, reqs, gens)
    assert all(isinstance(p, int) and 0 <= p < 300 for p in picks), picks
    if temperature < 1e-30 or top_p < 1e-30:  # nothing but the top token is left
        assert picks == logits.argmax(-1).tolist()


def test_a_vanishing_temperature_is_greedy_and_one_bad_row_fails_alone() -> None:
    logits = torch.stack([scores(1), torch.full((300,), math.nan), scores(2)])
    reqs = [request(1e-300), request(1.0), request(0.0)]
    picks = sample(logits, reqs, [None, None, None])
    assert picks[0] == int(logits[0].argmax()) and picks[2] == int(logits[2].argmax())
    assert isinstance(picks[1], ValueError) and str(picks[1]) == NO_SCORE


def test_non_finite_scores_are_not_picked() -> None:
    logits = scores(4)
    logits[[3, 9]] = math.nan
    logits[5] = -math.inf
    for temperature in (0.0, 1e-300, 1.0):
        pick = sample(logits.unsqueeze(0), [request(temperature)], [None])[0]
        assert isinstance(pick, int) and pick not in (3, 5, 9)
    logits[11] = math.inf  # an overflowed score is the top one
    assert sample(logits.unsqueeze(0), [request(1e-300)], [None]) == [11]


def test_top_p_samples_only_from_its_nucleus() -> None:
    logits = torch.full((50,), -10.0)
    logits[[4, 8]] = torch.tensor([5.0, 4.9])  # together nearly all the mass
    gen = torch.Generator().manual_seed(0)
    drawn = {draw(logits, 1.0, 0.9, gen) for _ in range(200)}
    assert drawn == {4, 8}


@settings(max_examples=300, deadline=None)
@given(temperature=st.floats(min_value=0.0, max_value=2.0, allow_subnormal=True),
       top_p=st.floats(min_value=0.0, max_value=1.0, exclude_min=True, allow_subnormal=True),
       values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32),
                       min_size=2, max_size=40))
def test_no_accepted_parameters_break_a_row_with_a_finite_score(
        temperature: float, top_p: float, values: list[float]) -> None:
    logits = torch.tensor(values, dtype=torch.float32)
    pick = sample(logits.unsqueeze(0), [request(temperature, top_p)],
                  [torch.Generator().manual_seed(1)])[0]
    if not bool(torch.isfinite(torch.nan_to_num(logits, nan=-math.inf,
                                                neginf=-math.inf)).any()):
        assert isinstance(pick, ValueError)
        return
    assert isinstance(pick, int) and not math.isnan(values[pick]) and values[pick] != -math.inf
