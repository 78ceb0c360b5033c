"""Structured outputs through the openai SDK (strict mode), on each generation engine
(``engine_model``): an extraction batch of 200 rows whose every output line parses and
validates against its JSON schema (jsonschema), realtime answers plain and streamed, JSON
mode, and a schema that cannot be enforced refused at once."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.helpers import jsonl, lines, upload, wait

pytestmark = pytest.mark.slow
SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "stars": {"type": "number"},
        "product": {"type": "object",
                    "properties": {"name": {"type": "string"}, "category": {"type": "string"}},
                    "required": ["name", "category"], "additionalProperties": False},
    },
    "required": ["sentiment", "stars", "product"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA,
                                                 "strict": True}}
PRODUCTS = ["kettle", "lamp", "towel", "headphones", "blender", "shoes", "chair", "phone"]
MOODS = ["Loved it", "Terrible", "It is fine", "Broke at once", "Great value", "Meh"]


def review(i: int) -> str:
    return f"{MOODS[i % len(MOODS)]}: the {PRODUCTS[i % len(PRODUCTS)]} I bought (order {i})."


ROWS = 100  # enough to share engine steps across rows; each costs a CPU model pass


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Extract the review as JSON."},
            {"role": "user", "content": review(i)}]


def test_an_extraction_batch_validates_line_by_line(sdk: Any, engine_model: str) -> None:
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": engine_model, "messages": messages(i), "temperature": 0,
                      "max_tokens": 80, "response_format": FORMAT}} for i in range(ROWS)]
    b = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                                     endpoint="/v1/chat/completions",
                                     completion_window="24h").id, timeout=900)
    assert b.status == "completed" and b.request_counts.completed == ROWS, b
    out = lines(sdk, b.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(r["custom_id"] for r in rows)
    for o in out:
        choice = o["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "stop", o
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_realtime_plain_streamed_and_json_mode(sdk: Any, engine_model: str) -> None:
    r = sdk.chat.completions.create(model=engine_model, messages=messages(1), temperature=0,
                                    max_tokens=80, response_format=FORMAT)
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    chunks = list(sdk.chat.completions.create(model=engine_model, messages=messages(1),
                                              temperature=0, max_tokens=80, stream=True,
                                              response_format=FORMAT))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    j = sdk.chat.completions.create(model=engine_model, messages=messages(2), temperature=0,
                                    max_tokens=60, response_format={"type": "json_object"})
    if j.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(j.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=engine_model, messages=messages(3), response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/no"}}})
    assert e.value.param == "response_format" and "cannot be enforced" in e.value.message


def test_responses_text_format(sdk: Any, engine_model: str) -> None:
    fmt = {"format": {"type": "json_schema", "name": "review", "schema": SCHEMA,
                      "strict": True}}
    r = sdk.responses.create(model=engine_model, instructions="Extract the review as JSON.",
                             input=review(4), temperature=0, max_output_tokens=80, text=fmt)
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    with sdk.responses.stream(model=engine_model, instructions="Extract the review as JSON.",
                              input=review(4), temperature=0, max_output_tokens=80,
                              text=fmt) as stream:
        final = stream.get_final_response()
    assert final.output_text == r.output_text
