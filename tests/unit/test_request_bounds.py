"""A generation request's bounds, as an attacker meets them where it is parsed
(jobs.protocol.limits): too many tools, schemas too deep or too big, schemas with no
finite answer or too wide for llguidance, and prompts far over the model's context are
400s naming the parameter, refused cheaply before anything is compiled, queued or
tokenized; an answer that broke its grammar is told from a whole one."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobs.core.errors import InvalidRequest
from jobs.fleet.catalog import Catalog, ModelInfo
from jobs.protocol.endpoints import CHAT, COMPLETIONS, RESPONSES
from jobs.protocol.limits import MAX_SCHEMA_BYTES, MAX_TOOLS
from jobs.protocol.parsing import parse_generation, parse_responses
from jobs.protocol.structured import Constraint

MODEL = "talker"
MODELS = Catalog([ModelInfo(MODEL, "chat", True, max_prompt_bytes=64 * 1024),
                  ModelInfo("plain", "chat", False)])
PATTERN = {"type": "object", "properties": {"code": {"type": "string",
                                                     "pattern": "^[a-z]{3,8}-[0-9]+$"}}}
SELF = {"$ref": "#"}
LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a"}
# an anyOf wider than a row of llguidance's parser (2,000 items), under the size cap
WIDE = {"anyOf": [{"required": [f"k{i}"]} for i in range(2500)]}
WIDE_OBJECTS = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                           "required": [f"k{i}"]} for i in range(5000)]}


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **kw}


def tools(n: int, parameters: dict[str, Any] = PATTERN) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": f"f{i}", "parameters": parameters}}
            for i in range(n)]


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def refused(body: dict[str, Any], endpoint: str = CHAT, models: Any = MODELS
            ) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        if endpoint == RESPONSES:
            parse_responses(body, models)
        else:
            parse_generation(endpoint, body, models)
    assert e.value.status == 400
    return e.value


def deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def test_thirty_thousand_tools_are_refused_at_once_before_any_is_read() -> None:
    t0 = time.perf_counter()
    e = refused(chat(tools=tools(30_000)))
    assert time.perf_counter() - t0 < 1.0
    assert e.param == "tools" and "128" in e.message
    # counted before anything else: before the model is looked up or a schema compiled
    e = refused(chat(model="plain", tools=tools(MAX_TOOLS + 1, SELF)))
    assert e.param == "tools" and str(MAX_TOOLS + 1) in e.message
    e = refused({"model": MODEL, "input": "x", "tools": [
        {"type": "function", "name": f"f{i}"} for i in range(MAX_TOOLS + 1)]}, RESPONSES)
    assert e.param == "tools"
    assert parse_generation(CHAT, chat(tools=tools(MAX_TOOLS)), MODELS).tools


def test_a_model_without_tools_is_refused_before_schemas_are_compiled() -> None:
    e = refused(chat(model="plain", tools=tools(3, SELF)))
    assert e.param == "tools" and e.code == "unsupported_parameter"


@pytest.mark.parametrize("schema,words", [
    (deep(33), "deeper than 32"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 64}
                                       for i in range(2000)}}, f"{MAX_SCHEMA_BYTES} bytes"),
    (WIDE_OBJECTS, f"{MAX_SCHEMA_BYTES} bytes"),
    (SELF, "no answer satisfies it"),
    (LOOP, "no answer satisfies it"),
    (WIDE, "cannot be enforced"),
])
def test_schemas_too_deep_too_big_or_without_a_finite_answer_are_refused(
        schema: dict[str, Any], words: str) -> None:
    e = refused(chat(response_format=fmt(schema)))
    assert e.param == "response_format" and words in e.message, e.message
    e = refused({"model": MODEL, "input": "x", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": schema}}}, RESPONSES)
    assert e.param == "text.format" and words in e.message, e.message
    refused(chat(response_format=fmt(schema)), models=None)  # where a worker re-reads it


def test_tools_schemas_are_bounded_together_and_a_required_call_must_be_possible() -> None:
    e = refused(chat(tools=tools(3, deep(40))))
    assert e.param == "tools.0.function.parameters" and "deeper" in e.message
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(60)}}
    e = refused(chat(tools=tools(MAX_TOOLS, big)))
    assert e.param is not None and e.param.startswith("tools.") and "bytes" in e.message
    e = refused(chat(tools=tools(2, {"type": "object", "allOf": [{"type": "string"}]}),
                     tool_choice="required"))
    assert (e.param or "").startswith("tools") and "cannot be enforced" in e.message
    assert parse_generation(CHAT, chat(tools=tools(MAX_TOOLS), tool_choice="required"),
                            MODELS).tool_choice == "required"


def test_a_deep_schema_is_refused_without_compiling_it() -> None:
    t0 = time.perf_counter()
    e = refused(chat(response_format=fmt(deep(60))))
    assert e.param == "response_format" and time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("endpoint,body,param", [
    (CHAT, chat(messages=[{"role": "user", "content": "é" * (5 << 20)}]), "messages"),
    (COMPLETIONS, {"model": MODEL, "prompt": "x" * (10 << 20)}, "prompt"),
    (RESPONSES, {"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x" * (10 << 20)}]}]}, "input"),
])
def test_a_ten_megabyte_prompt_is_refused_by_its_bytes(endpoint: str, body: dict[str, Any],
                                                        param: str) -> None:
    t0 = time.perf_counter()
    e = refused(body, endpoint)
    assert time.perf_counter() - t0 < 2.0
    assert e.param == param and e.code == "context_length_exceeded", e.message
    assert str(64 * 1024) in e.message


def test_a_prompt_within_the_bytes_is_parsed() -> None:
    ok = chat(messages=[{"role": "user", "content": "x" * (60 * 1024)}])
    assert parse_generation(CHAT, ok, MODELS).messages


def test_an_answer_that_broke_its_grammar_is_told_from_a_whole_one() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "required": ["a"]}
    c = Constraint(schema)
    assert c.broken('{"a": 1}') == ""
    assert "ended before" in c.broken('{"')
    assert "left its grammar" in c.broken('{"b": 1}')
