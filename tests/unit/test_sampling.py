"""Sampling (workers/engines/sampling.py) over the extremes of the accepted parameters: no
temperature in 0..2 and no top-p in (0, 1], subnormal values included, may make a row
unsampleable, and a row that cannot be sampled fails alone."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.engines.request import GenRequest
from workers.engines.sampling import (
    FLOOR,
    NO_SCORE,
    Pick,
    adjusted,
    choose,
    draw,
    log_probs,
    sample,
)

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


# Penalties, logit bias and log probabilities ---------------------------------------------

def scored(temperature: float = 1.0, **kw: object) -> GenRequest:
    return GenRequest(prompt=[1], max_new_tokens=1, temperature=temperature, **kw)  # type: ignore[arg-type]


FIXED = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0, 0.0])


def test_penalties_and_bias_are_openais_formula() -> None:
    """logit - presence * [count > 0] - frequency * count + bias, token by token."""
    req = scored(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={0: -100.0, 4: 2.5})
    z = adjusted(FIXED, req, {1: 3, 2: 1})
    want = [2.0 - 100, 1.0 - 0.5 - 0.25 * 3, 0.5 - 0.5 - 0.25, -1.0, 3.0 + 2.5, 0.0]
    assert z.dtype == torch.float64 and z.tolist() == pytest.approx(want)
    # negative penalties favour what was said; a masked score stays masked
    masked = FIXED.clone()
    masked[5] = -math.inf
    z = adjusted(masked, scored(presence_penalty=-2, frequency_penalty=-2,
                                logit_bias={5: 100.0}), {5: 4, 3: 2})
    assert z[3] == pytest.approx(-1.0 + 2 + 4) and z[5] == -math.inf


def test_log_probabilities_are_a_hand_computation_on_fixed_scores() -> None:
    for temperature in (0.0, 0.5, 1.0, 2.0):
        req = scored(temperature, logprobs=3, logit_bias={1: 1.5})
        gen = torch.Generator().manual_seed(3)
        pick = choose(FIXED.unsqueeze(0), [req], [gen], [{}])[0]
        assert isinstance(pick, Pick)
        z = [2.0, 2.5, 0.5, -1.0, 3.0, 0.0]
        t = temperature or 1.0  # greedy rows report the distribution at temperature 1
        norm = math.log(sum(math.exp(v / t) for v in z))
        want = [v / t - norm for v in z]
        assert pick.logprob == pytest.approx(want[pick.token], abs=1e-12)
        assert [i for i, _ in pick.top] == [4, 1, 0]  # the three most likely, best first
        assert [lp for _, lp in pick.top] == pytest.approx([want[4], want[1], want[0]])
        if temperature == 0:  # greedy: the sampled token is the most likely one
            assert pick.token == 4 and pick.logprob == max(lp for _, lp in pick.top)


def test_a_bias_of_minus_100_everywhere_leaves_the_distribution() -> None:
    everywhere = {i: -100.0 for i in range(len(FIXED))}
    plain = log_probs(adjusted(FIXED, scored(), None), 1.0)
    biased = log_probs(adjusted(FIXED, scored(logit_bias=everywhere), None), 1.0)
    assert biased.tolist() == pytest.approx(plain.tolist())
    picks = sample(FIXED.unsqueeze(0), [scored(0.0, logit_bias=everywhere)], [None])
    assert picks == [4]
    assert sample(FIXED.unsqueeze(0), [scored(0.0, logit_bias={3: 100.0})], [None]) == [3]


def test_a_token_too_unlikely_to_tell_is_floor_never_inf() -> None:
    lp = log_probs(adjusted(torch.tensor([0.0, -1e30, -math.inf, math.nan]), scored(), None),
                   1e-300)
    assert lp.tolist() == [0.0, FLOOR, FLOOR, FLOOR]
    rows = log_probs(torch.full((2, 3), -math.inf, dtype=torch.float64), 1.0)
    assert rows.eq(FLOOR).all()  # a position with no score at all: no NaN either


@settings(max_examples=300, deadline=None)
@given(temperature=st.floats(min_value=0.0, max_value=2.0, allow_subnormal=True),
       top_p=st.floats(min_value=0.0, max_value=1.0, exclude_min=True, allow_subnormal=True),
       presence=st.floats(min_value=-2, max_value=2), frequency=st.floats(min_value=-2,
                                                                          max_value=2),
       bias=st.floats(min_value=-100, max_value=100), count=st.integers(1, 2**31 - 1),
       values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32),
                       min_size=2, max_size=40))
def test_no_accepted_penalty_or_bias_breaks_a_row_or_its_log_probabilities(
        temperature: float, top_p: float, presence: float, frequency: float, bias: float,
        count: int, values: list[float]) -> None:
    logits = torch.tensor(values, dtype=torch.float32)
    req = scored(temperature, top_p=top_p, presence_penalty=presence,
                 frequency_penalty=frequency, logprobs=5,
                 logit_bias={i: bias for i in range(0, len(values), 2)})
    pick = choose(logits.unsqueeze(0), [req], [torch.Generator().manual_seed(1)],
                  [{0: count, len(values) - 1: 1}])[0]
    if not bool(torch.isfinite(torch.nan_to_num(logits, nan=-math.inf,
                                                neginf=-math.inf)).any()):
        assert isinstance(pick, ValueError)
        return
    assert isinstance(pick, Pick), pick
    assert not math.isnan(values[pick.token]) and values[pick.token] != -math.inf
    assert pick.logprob is not None and FLOOR <= pick.logprob <= 0
    assert all(math.isfinite(lp) and FLOOR <= lp <= 0 for _, lp in pick.top)
    assert [lp for _, lp in pick.top] == sorted((lp for _, lp in pick.top), reverse=True)


def test_a_row_whose_bias_names_no_token_fails_alone() -> None:
    logits = torch.stack([scores(1), scores(2)])
    picks = choose(logits, [scored(0.0, logit_bias={10**6: 1.0}), scored(0.0)], [None, None],
                   [{}, {}])
    assert isinstance(picks[0], IndexError) and isinstance(picks[1], Pick)
    assert picks[1].token == int(logits[1].argmax())
