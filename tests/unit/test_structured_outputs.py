"""Structured outputs (jobs.protocol.structured) on both generation engines, on the real
SmolLM2-135M-Instruct: every answer to a json_schema request parses and validates
(jsonschema) or ends on its length limit; JSON mode gives one object; choices, log
probabilities and realtime priority keep working under a constraint; a schema that
cannot be enforced is refused where the request is parsed, naming why."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from jobs.core.errors import InvalidRequest
from jobs.core.settings import default_cache_dir
from jobs.protocol.endpoints import CHAT
from jobs.protocol.parsing import parse_generation
from jobs.protocol.structured import Constraint
from workers.engines.generation.engine import GenerationEngine
from workers.engines.request import GenRequest, build_request
from workers.engines.sinks import Collect, FinishReason
from workers.engines.vllm import VllmEngine
from workers.models.chat import ChatModel, ChatTokens

SMOL = "SmolLM2-135M-Instruct"
REVIEW = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "score": {"type": "number"},
        "product": {"type": "object", "properties": {"name": {"type": "string"},
                                                     "category": {"type": "string"}},
                    "required": ["name", "category"], "additionalProperties": False},
    },
    "required": ["sentiment", "score", "product"],
    "additionalProperties": False,
}
TEXTS = ["The blender broke after two days. Useless.", "Lovely soft towels, great price!",
         "The lamp is fine, nothing special.", "Best headphones I ever owned.",
         "Shoes arrived wet and torn.", "A decent kettle that boils fast."]


def fmt(schema: dict[str, Any] = REVIEW) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "review", "schema": schema,
                                                   "strict": True}}


@pytest.fixture(scope="module")
def smol_dir():  # type: ignore[no-untyped-def]
    from workers.models.importers import converted_dir, smollm2_gguf

    return converted_dir(default_cache_dir(), SMOL, "1", smollm2_gguf())


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def engine(request, smol_dir):  # type: ignore[no-untyped-def]
    e: Any = (GenerationEngine(ChatModel(SMOL, smol_dir)) if request.param == "transformers"
              else VllmEngine(ChatTokens(SMOL, smol_dir), smol_dir, max_batch_rows=8,
                              max_rows=16, kv_cache_bytes=512 << 20))
    yield e
    e.stop()


def ask(engine: Any, text: str, prio: int = 2, **kw: Any) -> Collect:
    c = Collect()
    body = {"model": SMOL, "messages": [
        {"role": "system", "content": "Extract the review as JSON."},
        {"role": "user", "content": text}], "max_tokens": 120, **kw}
    engine.submit(build_request(engine.model, CHAT, body), c, prio)
    return c


def test_every_answer_validates_against_its_schema(engine: Any) -> None:
    sinks = [ask(engine, t, response_format=fmt(), temperature=i % 2, seed=i)
             for i, t in enumerate(TEXTS)]
    for c in sinks:
        c.result(600)
        if c.reason == FinishReason.LENGTH:
            continue  # cut by max_tokens: may be incomplete, and says so
        jsonschema.validate(json.loads(c.text), REVIEW)
    assert sum(c.reason == FinishReason.STOP for c in sinks) >= len(sinks) - 1


def test_json_mode_choices_and_log_probabilities(engine: Any) -> None:
    c = ask(engine, TEXTS[1], response_format={"type": "json_object"}, n=2, seed=3,
            temperature=0.8, logprobs=True, top_logprobs=3, max_tokens=60)
    c.result(600)
    assert len(c.choices) == 2
    for ch in c.choices:
        if ch.reason == "stop":
            assert isinstance(json.loads("".join(ch.parts)), dict)
        assert ch.tokens
        for t in ch.tokens:
            assert t.logprob is not None and -9999.0 <= t.logprob <= 0
            assert all(-9999.0 <= lp <= 0 for _, _, lp in t.top or [])


def test_unconstrained_rows_in_the_same_steps_are_untouched(engine: Any) -> None:
    """Constrained and free rows share steps: the free ones answer as they do alone."""
    alone = ask(engine, "What is the capital of France?", temperature=0, max_tokens=16)
    alone.result(600)
    mixed = [ask(engine, t, response_format=fmt(), temperature=0) for t in TEXTS[:2]]
    free = ask(engine, "What is the capital of France?", temperature=0, max_tokens=16,
               prio=0)
    assert free.result(600).text == alone.text
    for c in mixed:
        c.result(600)


def test_a_length_cut_says_length(engine: Any) -> None:
    c = ask(engine, TEXTS[0], response_format=fmt(), temperature=0, max_tokens=5)
    c.result(600)
    assert c.reason == FinishReason.LENGTH and c.usage.completion_tokens == 5


@pytest.mark.parametrize("bad,words", [
    ({"type": "json_schema"}, "json_schema: required"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
     "cannot be enforced"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": "low"}}}, "cannot be enforced"),
    ({"type": "json_schema", "json_schema": {"name": "no spaces", "schema": {}}}, "name"),
    ({"type": "json_object", "json_schema": {"name": "x"}}, "only with type"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}},
     "extra"),
])
def test_schemas_that_cannot_be_enforced_are_refused(bad: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_generation(CHAT, {"model": SMOL, "messages": [{"role": "user", "content": "x"}],
                                "response_format": bad})
    assert e.value.status == 400 and words in e.value.message, e.value.message
    assert (e.value.param or "").startswith("response_format")


def test_a_parsed_body_reads_back_as_sent() -> None:
    """Parsed bodies are dumped and sent on to the workers: the schema keeps its name."""
    body = {"model": SMOL, "messages": [{"role": "user", "content": "x"}],
            "response_format": fmt()}
    req = parse_generation(CHAT, body)
    for dumped in (req.model_dump(exclude_none=True),
                   req.model_dump(mode="json", exclude_unset=True)):
        assert dumped["response_format"] == fmt()
        again = parse_generation(CHAT, dumped)
        assert again.response_format is not None
        assert again.response_format.answer_schema() == REVIEW


def test_responses_text_format_runs_as_chats_response_format() -> None:
    from openai.types.responses import Response

    from jobs.protocol.endpoints import RESPONSES
    from jobs.protocol.parsing import parse_responses, supported
    from jobs.protocol.responses import response_body
    from jobs.protocol.responses_request import as_chat

    text = {"format": {"type": "json_schema", "name": "review", "schema": REVIEW,
                       "strict": True}}
    body = supported(RESPONSES, {"model": SMOL, "input": "x", "text": text})
    endpoint, chat = as_chat(RESPONSES, body)
    assert endpoint == CHAT and chat["response_format"] == fmt()
    assert parse_generation(CHAT, chat).response_format is not None
    answer = response_body(parse_responses(body), '{"a": 1}', "stop", 5, 3)
    assert answer["text"]["format"] == text["format"]
    Response.model_validate(answer)
    plain = response_body(parse_responses({"model": SMOL, "input": "x"}), "hi", "stop", 1, 1)
    assert plain["text"]["format"] == {"type": "text"}
    mode = supported(RESPONSES, {"model": SMOL, "input": "x",
                                 "text": {"format": {"type": "json_object"}}})
    assert as_chat(RESPONSES, mode)[1]["response_format"] == {"type": "json_object"}
    for bad, words in (({"type": "json_schema", "schema": REVIEW}, "name and schema"),
                       ({"type": "json_schema", "name": "x", "schema": {"$ref": "#/no"}},
                        "cannot be enforced"),
                       ({"type": "text", "name": "x"}, "are for type 'json_schema'")):
        with pytest.raises(InvalidRequest) as e:
            parse_responses(supported(RESPONSES, {"model": SMOL, "input": "x",
                                                  "text": {"format": bad}}))
        assert words in e.value.message and (e.value.param or "").startswith("text")


# A grammar that fails midway (an ``anyOf`` of 5,000 objects: llguidance's parser
# refuses a row that wide once the answer has begun) ends the answer with an error on
# both generation engines, never with ``finish_reason: "stop"`` on text that does not
# parse. (Such a schema is refused where a request is parsed; the engines are given it
# directly here.)
WIDE = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                   "required": [f"k{i}"]} for i in range(5000)]}


def test_a_grammar_failing_midway_ends_the_answer_with_an_error(engine: Any
                                                                ) -> None:
    prompt = engine.model.chat_ids([{"role": "user", "content": "Answer in JSON."}], None)
    c = Collect()
    engine.submit(GenRequest(prompt=prompt, max_new_tokens=24, temperature=0,
                             constraint=Constraint(WIDE)), c, 2)
    c.event.wait(600)
    assert c.error is not None, (c.text, getattr(c, "reason", None))
