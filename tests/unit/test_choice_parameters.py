"""The request parameters that shape choices (jobs.protocol.generation): n, best_of, echo, log
probabilities, presence and frequency penalties and logit_bias are read within OpenAI's
bounds, and a value outside them is a 400 naming its parameter."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.core.errors import InvalidRequest
from jobs.protocol.endpoints import CHAT, COMPLETIONS
from jobs.protocol.generation import ChatBody, CompletionBody
from jobs.protocol.parsing import parse_generation

MINIMAL = {CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
           COMPLETIONS: {"model": "m", "prompt": "hi"}}


def test_choices_logprobs_penalties_and_bias_are_read() -> None:
    req = parse_generation(CHAT, {**MINIMAL[CHAT], "n": 3, "logprobs": True,
                                  "top_logprobs": 20, "presence_penalty": -2,
                                  "frequency_penalty": 1.5,
                                  "logit_bias": {"50256": -100, "7": 2.5}})
    assert isinstance(req, ChatBody)
    assert (req.n, req.top_count(), req.presence_penalty, req.frequency_penalty) == (
        3, 20, -2.0, 1.5)
    assert req.token_bias() == {50256: -100.0, 7: 2.5}
    assert parse_generation(CHAT, {**MINIMAL[CHAT], "logprobs": True}).top_count() == 0
    assert parse_generation(CHAT, MINIMAL[CHAT]).top_count() is None
    comp = parse_generation(COMPLETIONS, {**MINIMAL[COMPLETIONS], "logprobs": 0,
                                          "echo": True, "n": 2, "best_of": 4})
    assert isinstance(comp, CompletionBody)
    assert (comp.top_count(), comp.echo, comp.n, comp.candidates()) == (0, True, 2, 4)
    five = parse_generation(COMPLETIONS, {**MINIMAL[COMPLETIONS], "n": 5})
    assert isinstance(five, CompletionBody) and five.candidates() == 5
    # best_of 1 streams, and so does n
    parse_generation(COMPLETIONS, {**MINIMAL[COMPLETIONS], "best_of": 1, "stream": True})
    parse_generation(COMPLETIONS, {**MINIMAL[COMPLETIONS], "n": 2, "stream": True})


@pytest.mark.parametrize(("endpoint", "extra", "param"), [
    (CHAT, {"n": 0}, "n"), (CHAT, {"n": 129}, "n"), (CHAT, {"n": 2.0}, "n"),
    (CHAT, {"n": True}, "n"), (CHAT, {"presence_penalty": 2.5}, "presence_penalty"),
    (CHAT, {"frequency_penalty": -2.01}, "frequency_penalty"),
    (CHAT, {"presence_penalty": False}, "presence_penalty"),
    (CHAT, {"logprobs": 0}, "logprobs"), (CHAT, {"logprobs": "true"}, "logprobs"),
    (CHAT, {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    (CHAT, {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"logit_bias": {"50256": 101}}, "logit_bias"),
    (CHAT, {"logit_bias": {"50256": -100.5}}, "logit_bias"),
    (CHAT, {"logit_bias": {"-1": 1}}, "logit_bias"),
    (CHAT, {"logit_bias": {"cat": 1}}, "logit_bias"),
    (CHAT, {"logit_bias": {"1.5": 1}}, "logit_bias"),
    (CHAT, {"logit_bias": {"99999999999": 1}}, "logit_bias"),
    (CHAT, {"logit_bias": {"5": True}}, "logit_bias.5"),
    (CHAT, {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    (CHAT, {"logit_bias": [1]}, "logit_bias"),
    (COMPLETIONS, {"logprobs": 6}, "logprobs"), (COMPLETIONS, {"logprobs": True}, "logprobs"),
    (COMPLETIONS, {"echo": 1}, "echo"), (COMPLETIONS, {"best_of": 21}, "best_of"),
    (COMPLETIONS, {"n": 3, "best_of": 2}, "best_of"),
    (COMPLETIONS, {"best_of": 2, "stream": True}, "best_of"),
])
def test_out_of_bounds_values_are_refused_naming_them(endpoint: str, extra: dict[str, Any],
                                                      param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_generation(endpoint, {**MINIMAL[endpoint], **extra})
    assert (e.value.param, e.value.status) == (param, 400), e.value.message
    assert e.value.message.startswith(f"{param}: "), e.value.message
