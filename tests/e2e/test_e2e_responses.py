"""/v1/responses with the real SmolLM2-135M-Instruct through the HTTP API and the
openai SDK in strict mode: plain, with instructions and multi-turn input (the same
answer as the chat request it runs as), streamed (``stream=True`` and
``client.responses.stream``), cut short by ``max_output_tokens``; what it does not
implement refused naming the parameter; a JSONL and a Parquet batch, and a job."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai._models import validate_type
from openai.types.responses import Response

from tests.helpers import jsonl, lines, upload, wait

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
FRANCE = "What is the capital of France?"


def test_a_plain_response_knows_paris(sdk) -> None:  # type: ignore[no-untyped-def]
    r = sdk.responses.create(model=MODEL, input=FRANCE, temperature=0, max_output_tokens=24,
                             metadata={"run": "e2e"})
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert "Paris" in r.output_text and r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.metadata == {"run": "e2e"} and r.temperature == 0
    assert r.usage.input_tokens > 5 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_and_turns_are_the_chat_request(sdk) -> None:  # type: ignore[no-untyped-def]
    first = sdk.responses.create(model=MODEL, input="Name a colour.", temperature=0,
                                 max_output_tokens=8)
    turns: Any = [{"role": "user", "content": "Name a colour."},
                  *[item.model_dump() for item in first.output],  # the answer given back
                  {"role": "user", "content": [{"type": "input_text", "text": "Another?"}]}]
    r = sdk.responses.create(model=MODEL, instructions="You are brief.", input=turns,
                             temperature=0, max_output_tokens=16)
    chat = sdk.chat.completions.create(model=MODEL, temperature=0, max_tokens=16, messages=[
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another?"}])
    assert r.output_text == chat.choices[0].message.content
    assert r.instructions == "You are brief."
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_streamed_events_make_the_same_answer(sdk) -> None:  # type: ignore[no-untyped-def]
    kw: dict[str, Any] = dict(model=MODEL, input="Name three colours of the rainbow.",
                              temperature=0, max_output_tokens=24)
    whole = sdk.responses.create(**kw)
    events = list(sdk.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert types[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2 and "".join(deltas) == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    with sdk.responses.stream(**kw) as stream:
        seen = [e.delta for e in stream if e.type == "response.output_text.delta"]
        done = stream.get_final_response() if whole.status == "completed" else None
    assert "".join(seen) == whole.output_text
    if done is not None:
        assert done.output_text == whole.output_text


def test_the_token_limit_makes_it_incomplete(sdk) -> None:  # type: ignore[no-untyped-def]
    r = sdk.responses.create(model=MODEL, input="Tell a long story about a dragon.",
                             temperature=0, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = list(sdk.responses.create(model=MODEL, input="Tell a long story.",
                                       temperature=0, max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete"


def refused(call: Any, param: str, code: str = "unsupported_parameter") -> None:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    err = e.value.body
    assert isinstance(err, dict) and (err["param"], err["code"]) == (param, code), err
    assert err["type"] == "invalid_request_error" and err["message"]
    if code.endswith("_parameter"):
        assert err["message"].startswith(f"{param}: ")


def test_what_it_does_not_implement_is_refused_naming_it(sdk) -> None:  # type: ignore[no-untyped-def]
    create = sdk.responses.create
    refused(lambda: create(model=MODEL, input="hi", store=True), "store")
    refused(lambda: create(model=MODEL, input="hi", previous_response_id="resp_x"),
            "previous_response_id")
    refused(lambda: create(model=MODEL, input="hi", tools=[
        {"type": "function", "name": "f", "parameters": {}, "strict": True}]), "tools")
    refused(lambda: create(model=MODEL, input="hi", reasoning={"effort": "low"}), "reasoning")
    refused(lambda: create(model=MODEL, input="hi", stream=True, top_logprobs=2),
            "top_logprobs")  # a stream is refused before it starts
    refused(lambda: create(model=MODEL, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://x.invalid/a.png", "detail": "auto"}]}]),
        "input.0.content.0.type")
    refused(lambda: create(model=MODEL, input=[{"type": "item_reference", "id": "msg_1"}]),
            "input.0.type")
    refused(lambda: create(model=MODEL, input=[  # its chat template does not render tools
        {"type": "function_call_output", "call_id": "c", "output": "4"}]), "tools")
    refused(lambda: create(model=MODEL, input="hi", extra_body={"messages": []}), "messages",
            "unknown_parameter")
    refused(lambda: create(model="all-MiniLM-L6-v2", input="hi"), "model", "model_not_found")
    ok = create(model=MODEL, input="hi", store=False, max_output_tokens=2, tool_choice="none",
                truncation="disabled", text={"format": {"type": "text"}}, include=[])
    assert ok.status == "incomplete"


def test_a_responses_batch(sdk) -> None:  # type: ignore[no-untyped-def]
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
             "body": {"input": f"Count to {i % 4 + 1}.", "max_output_tokens": 6}}
            for i in range(12)]
    rows.append({"custom_id": "bad", "method": "POST", "url": "/v1/responses",
                 "body": {"input": "hi", "store": True}})
    b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id, endpoint="/v1/responses",
                           completion_window="24h",
                           extra_body={"body": {"model": MODEL, "temperature": 0,
                                                "instructions": "Be brief."}})
    b = wait(sdk, b.id)
    assert b.status == "completed", b
    assert (b.request_counts.completed, b.request_counts.failed) == (12, 1)
    out = lines(sdk, b.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(12))
    bodies = [validate_type(type_=Response, value=x["response"]["body"]) for x in out]
    assert all(r.output_text and r.usage.output_tokens <= 6 for r in bodies)
    assert all(r.instructions == "Be brief." for r in bodies)
    assert b.usage.input_tokens == sum(r.usage.input_tokens for r in bodies)
    assert b.usage.output_tokens == sum(r.usage.output_tokens for r in bodies)
    err = lines(sdk, b.error_file_id)
    assert [(e["custom_id"], e["response"]["body"]["error"]["param"]) for e in err] == [
        ("bad", "store")]

    table = pa.table({"custom_id": ["p0", "p1"], "input": ["Say hi.", "Say bye."]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    p = sdk.batches.create(input_file_id=upload(sdk, buf.getvalue(), "in.parquet").id,
                           endpoint="/v1/responses", completion_window="24h",
                           extra_body={"body": {"model": MODEL, "max_output_tokens": 4}})
    p = wait(sdk, p.id)
    assert p.status == "completed", p
    got = pq.read_table(io.BytesIO(sdk.files.content(p.output_file_id).read())).to_pylist()
    assert sorted(r["custom_id"] for r in got) == ["p0", "p1"]
    assert all(r["status_code"] == 200 and r["content"] and r["finish_reason"] in
               ("stop", "length") and 0 < r["completion_tokens"] <= 4 for r in got)


def test_a_responses_job(sdk) -> None:  # type: ignore[no-untyped-def]
    job: Any = sdk.post("/jobs", cast_to=object, body={"endpoint": "/v1/responses", "body": {
        "model": MODEL, "input": FRANCE, "temperature": 0, "max_output_tokens": 16,
        "metadata": {"via": "job"}}})
    deadline = time.monotonic() + 120
    while job["status"] not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.3)
        job = sdk.get(f"/jobs/{job['id']}", cast_to=object)
    assert job["status"] == "completed", json.dumps(job)
    r = validate_type(type_=Response, value=job["result"])
    assert "Paris" in r.output_text and r.metadata == {"via": "job"}
