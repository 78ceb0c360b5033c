"""Log probabilities, several choices, logit_bias, penalties, echo and best_of through the
HTTP API with the openai SDK (strict response validation), on the realtime lane with the
real SmolLM2-135M-Instruct, streamed and not, and as a job."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
ANIMALS = [{"role": "user", "content": "Name three animals."}]


def test_chat_logprobs_plain_and_streamed(sdk) -> None:  # type: ignore[no-untyped-def]
    kw: dict[str, Any] = dict(model=MODEL, messages=ANIMALS, temperature=0, max_tokens=8,
                              logprobs=True, top_logprobs=3)
    r = sdk.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:  # greedy: each token is the most likely at its position
        assert len(t.top_logprobs) == 3 and t.logprob == t.top_logprobs[0].logprob <= 0
        assert bytes(t.bytes).decode() == t.token
    chunks = list(sdk.chat.completions.create(**kw, stream=True,
                                              stream_options={"include_usage": True}))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content],
                                                           abs=1e-4)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_n_choices_plain_and_streamed(sdk) -> None:  # type: ignore[no-untyped-def]
    kw: dict[str, Any] = dict(model=MODEL, messages=ANIMALS, temperature=1.0, max_tokens=6,
                              n=2, seed=7)
    r = sdk.chat.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 5
    chunks = list(sdk.chat.completions.create(**kw, stream=True))
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert "".join(ch.delta.content or "" for ch in mine) == r.choices[i].message.content
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "length"
    one = sdk.chat.completions.create(**{**kw, "n": 1})
    assert one.choices[0].message.content == r.choices[0].message.content  # seed + 0


def test_logit_bias_and_penalties(sdk, smol_token) -> None:  # type: ignore[no-untyped-def]
    r = sdk.chat.completions.create(model=MODEL, messages=ANIMALS, temperature=0,
                                    max_tokens=4, logit_bias={str(smol_token): 100})
    assert r.choices[0].message.content == " cat" * 4
    ones = dict(model=MODEL, prompt="1, 1, 1, 1, 1, 1, 1, 1,", temperature=0, max_tokens=12)
    plain = sdk.completions.create(**ones).choices[0].text
    penalized = sdk.completions.create(**ones, frequency_penalty=2.0).choices[0].text
    assert penalized != plain
    with pytest.raises(Exception) as e:  # an id the model does not have: 400, named
        sdk.chat.completions.create(model=MODEL, messages=ANIMALS,
                                    logit_bias={"999999": 1})
    assert getattr(e.value, "status_code", None) == 400
    assert e.value.body["param"] == "logit_bias"  # type: ignore[attr-defined]


@pytest.fixture
def smol_token() -> int:
    """" cat" in SmolLM2's tokenizer (one token)."""
    from transformers import AutoTokenizer

    from jobs.core.settings import default_cache_dir
    from workers.models.importers import converted_dir, smollm2_gguf

    tok = AutoTokenizer.from_pretrained(str(converted_dir(default_cache_dir(), MODEL, "1",
                                                          smollm2_gguf())))
    (tid,) = tok(" cat")["input_ids"]
    return int(tid)


def test_echo_and_best_of_on_completions(sdk) -> None:  # type: ignore[no-untyped-def]
    # An echo's first token has a null log probability (as OpenAI's): the SDK's type says
    # a number, so strict validation would refuse it; its client reads it as None.
    from openai import OpenAI

    lenient = OpenAI(base_url=str(sdk.base_url), api_key=sdk.api_key, max_retries=0)
    prompt = "The capital of France is"
    r = lenient.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=4,
                                   echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt) and lp.token_logprobs[0] is None
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    best = sdk.completions.create(model=MODEL, prompt="My favourite food is", max_tokens=5,
                                  temperature=1.0, seed=3, best_of=3)
    every = sdk.completions.create(model=MODEL, prompt="My favourite food is", max_tokens=5,
                                   temperature=1.0, seed=3, n=3, logprobs=0)
    assert len(best.choices) == 1 and best.usage.completion_tokens == \
        every.usage.completion_tokens == 15

    def mean(c: Any) -> float:
        return sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs)

    assert best.choices[0].text == max(every.choices, key=mean).text


def test_a_job_answers_with_every_choice_and_its_logprobs(sdk) -> None:  # type: ignore[no-untyped-def]
    job = sdk.post("/jobs", cast_to=object, body={"endpoint": "/v1/chat/completions", "body": {
        "model": MODEL, "messages": ANIMALS, "temperature": 0, "max_tokens": 4, "n": 2,
        "logprobs": True}})
    deadline = time.monotonic() + 300
    while (done := sdk.get(f"/jobs/{job['id']}", cast_to=object))["status"] not in (
            "completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert done["status"] == "completed", done
    res = done["result"]
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert all(len(c["logprobs"]["content"]) == 4 for c in res["choices"])
    assert res["usage"]["completion_tokens"] == 8
