"""Tool calls through the openai SDK (strict mode), on each generation engine: a tiny
random-weight Llama whose Hermes-style chat template renders tools (SmolLM2's
tokenizer), added with ``models add`` and placed on the session's worker on its first
request. ``tool_choice: "required"`` and a named function always give calls that parse
and validate against their function's schema (jsonschema), however random the weights;
``parallel_tool_calls: false`` gives one; a stream's ``delta.tool_calls`` assemble in the
SDK; a conversation with a tool message is taken; /v1/responses answers with
``function_call`` items; jobs and batch lines (JSONL, Parquet) read calls back alike,
a bad line being its own error line; and the builtin SmolLM2, whose template does not
render tools, refuses them naming itself."""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai._models import validate_type
from openai.lib.streaming.chat._completions import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from jobs.core.context import Context
from jobs.fleet import own_models, registry
from tests.helpers import jsonl, lines, served, upload, wait
from tests.tool_cases import HERMES, SCHEMAS, TOOLS

pytestmark = pytest.mark.slow
SFX = str(int(time.time() * 1000) % 10**8)
SMOL = "SmolLM2-135M-Instruct"
ASK = [{"role": "system", "content": "You are a weather bot."},
       {"role": "user", "content": "What is the weather in Oslo, in celsius?"}]
R_TOOLS = [{"type": "function", "name": t["function"]["name"],
            "parameters": t["function"]["parameters"], "strict": True} for t in TOOLS]


@pytest.fixture(scope="module")
def tool_llama(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder: SmolLM2's tokenizer, the Hermes template, tiny random weights."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from workers.models.cache import tokenizer_dir

    ctx = Context(stack.settings)
    try:
        smol = registry.get_default(ctx, SMOL)
        assert smol is not None
        path = tmp_path_factory.mktemp("tool-llama") / "model"
        shutil.copytree(tokenizer_dir(ctx, smol), path, ignore=shutil.ignore_patterns(
            "config.json", "chat_template.jinja", ".*"))
    finally:
        ctx.close()
    (path / "chat_template.jinja").write_text(HERMES)
    tok = AutoTokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(  # (head_dim 64: vLLM's CPU attention has no kernel for 16)
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def model(request: pytest.FixtureRequest, stack: Any, sdk: Any, tool_llama: Path) -> str:
    """The tool Llama added on one engine, and loaded: its name."""
    name = f"tools-{request.param}-{SFX}"
    ctx = Context(stack.settings)
    try:
        added = own_models.add(ctx, name, str(tool_llama), "chat", engine=request.param)
        assert added.model.tools is True
    finally:
        ctx.close()
    served(lambda: sdk.chat.completions.create(model=name, messages=ASK, max_tokens=1))
    return name


def named(fn: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": fn}}


def valid_calls(message: Any, only: str | None = None) -> list[Any]:
    calls = message.tool_calls or []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert only is None or c.function.name == only
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


def test_required_and_named_calls_validate(sdk: Any, model: str) -> None:
    for seed in range(3):
        r = sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS, seed=seed,
                                        tool_choice="required", parallel_tool_calls=False,
                                        max_tokens=200)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(valid_calls(choice.message)) == 1
        for fn in SCHEMAS:
            r = sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS, seed=seed,
                                            tool_choice=named(fn), max_tokens=300)
            # several calls allowed: random weights may write calls until the limit
            assert r.choices[0].finish_reason in ("tool_calls", "length"), r
            assert len(valid_calls(r.choices[0].message, only=fn)) >= 1
    many = sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS, n=2, seed=1,
                                       tool_choice="required", max_tokens=300)
    for choice in many.choices:
        if choice.finish_reason == "tool_calls":
            assert valid_calls(choice.message)


def test_streamed_calls_assemble_in_the_sdk(sdk: Any, model: str) -> None:
    state = ChatCompletionStreamState()
    with sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS, seed=3,
                                     tool_choice=named("get_weather"), stream=True,
                                     parallel_tool_calls=False, max_tokens=200) as stream:
        for chunk in stream:
            state.handle_chunk(validate_type(type_=ChatCompletionChunk, value=chunk))
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert len(valid_calls(final.message, only="get_weather")) == 1
    plain = sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS, seed=3,
                                        tool_choice=named("get_weather"),
                                        parallel_tool_calls=False, max_tokens=200)
    assert plain.choices[0].message.tool_calls[0].function.arguments == \
        final.message.tool_calls[0].function.arguments  # type: ignore[index]


def test_a_conversation_with_a_tool_result(sdk: Any, model: str) -> None:
    first = sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS, seed=0,
                                        tool_choice="required", parallel_tool_calls=False,
                                        max_tokens=200)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "4 degrees, clear"}]
    r = sdk.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                    temperature=0, max_tokens=6)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > first.usage.prompt_tokens
    none = sdk.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                       tool_choice="none", temperature=0, max_tokens=6)
    assert none.choices[0].message.tool_calls is None
    assert none.usage.prompt_tokens < r.usage.prompt_tokens  # the tools are not rendered


def test_responses_function_calls(sdk: Any, model: str) -> None:
    r = sdk.responses.create(model=model, input="Weather in Lima?", tools=R_TOOLS,
                             tool_choice="required", parallel_tool_calls=False,
                             max_output_tokens=200)
    assert r.status == "completed" and [i.type for i in r.output] == ["function_call"]
    item = r.output[0]
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])
    assert item.call_id.startswith("call_") and item.status == "completed"
    follow = sdk.responses.create(model=model, tools=R_TOOLS, max_output_tokens=5, input=[
        {"role": "user", "content": "Weather in Lima?"},
        {"type": "function_call", "call_id": item.call_id, "name": item.name,
         "arguments": item.arguments},
        {"type": "function_call_output", "call_id": item.call_id, "output": "warm"}])
    assert follow.status in ("completed", "incomplete")
    with sdk.responses.stream(model=model, input="Weather in Lima?", tools=R_TOOLS,
                              tool_choice={"type": "function", "name": "get_time"},
                              parallel_tool_calls=False, max_output_tokens=200) as stream:
        final = stream.get_final_response()
    assert final.output and all(i.type == "function_call" and i.name == "get_time"
                                for i in final.output)


def test_jobs_and_batches(sdk: Any, model: str) -> None:
    body = {"model": model, "messages": ASK, "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 200}
    job: Any = sdk.post("/jobs", cast_to=object, body={"endpoint": "/v1/chat/completions",
                                                       "body": body})
    deadline = time.monotonic() + 180
    while job["status"] not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.3)
        job = sdk.get(f"/jobs/{job['id']}", cast_to=object)
    assert job["status"] == "completed", job
    assert job["result"]["choices"][0]["finish_reason"] == "tool_calls"
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {**body, "seed": i}} for i in range(4)]
    rows.append({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
                 "body": {**body, "tool_choice": named("nope")}})
    b = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                                     endpoint="/v1/chat/completions",
                                     completion_window="24h").id, timeout=300)
    assert b.status == "completed" and (b.request_counts.completed,
                                        b.request_counts.failed) == (4, 1), b
    for o in lines(sdk, b.output_file_id):
        message = o["response"]["body"]["choices"][0]["message"]
        for c in message["tool_calls"]:
            jsonschema.validate(json.loads(c["function"]["arguments"]),
                                SCHEMAS[c["function"]["name"]])
    assert [e["response"]["body"]["error"]["param"] for e in lines(sdk, b.error_file_id)] \
        == ["tool_choice"]
    buf = io.BytesIO()
    pq.write_table(pa.table({"custom_id": ["p0", "p1"], "messages": [
        json.dumps(ASK), json.dumps(ASK[1:])]}), buf)
    defaults = {k: v for k, v in body.items() if k != "messages"}
    p = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, buf.getvalue(), "in.parquet").id,
                                     endpoint="/v1/chat/completions", completion_window="24h",
                                     extra_body={"body": defaults}).id, timeout=300)
    assert p.status == "completed", p
    got = pq.read_table(io.BytesIO(sdk.files.content(p.output_file_id).read())).to_pylist()
    assert sorted(r["custom_id"] for r in got) == ["p0", "p1"]
    for r in got:
        assert r["finish_reason"] == "tool_calls" and r["content"] is None
        calls = json.loads(r["tool_calls"])
        assert len(calls) == 1 and calls[0]["function"]["name"] in SCHEMAS


def test_a_model_without_tool_support_refuses_them(sdk: Any) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=SMOL, messages=ASK, tools=TOOLS)
    assert e.value.code == "unsupported_parameter" and SMOL in e.value.message
    assert "chat template does not render tools" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        sdk.responses.create(model=SMOL, input="hi", tools=R_TOOLS)
    assert SMOL in e.value.message
    assert sdk.get(f"/models/{SMOL}", cast_to=object)["tools"] is False
