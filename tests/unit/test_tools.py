"""Tool calls (jobs.protocol.tools, tool_use, tool_calls): calls read back from generated
text, whole or as it streams (malformed blocks and unknown functions stay text), the
request checks, the Lark grammar of a required call (it compiles, and llguidance
accepts exactly the calls it allows), and a tiny random-weight Llama whose Hermes-style
chat template renders tools, run on the transformers engine: a required or named call
always parses and validates against its function's schema, however random the weights;
a model whose template does not render tools is refused naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from openai import omit
from openai._models import validate_type
from openai.lib.streaming.chat._completions import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from jobs.core.errors import InvalidRequest
from jobs.core.settings import default_cache_dir
from jobs.protocol.endpoints import CHAT, RESPONSES
from jobs.protocol.objects.inference import ChatCompletion as ChatAnswer
from jobs.protocol.parsing import parse_generation, parse_responses
from jobs.protocol.responses import EventWriter, response_body
from jobs.protocol.responses_request import chat_body
from jobs.protocol.shapes import ChunkWriter
from jobs.protocol.tool_calls import CallStream, ChunkCalls, parse, rewrite_completion
from jobs.protocol.tool_use import Function, Tools, tools_of
from jobs.protocol.tools import renders_tools
from tests.tool_cases import HERMES, SCHEMAS, TIME, TOOLS, WEATHER

SPEC = Tools((Function("get_weather", None, WEATHER), Function("get_time", None, TIME)))
CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": '
        '"celsius"}}\n</tool_call>')


def strict(type_: Any, value: Any) -> Any:
    """``value`` as the SDK reads it in strict mode (_strict_response_validation)."""
    return validate_type(type_=type_, value=orjson.loads(orjson.dumps(value)))


# Reading calls back ----------------------------------------------------------------------------


def test_one_call_is_read_and_the_content_is_null() -> None:
    content, calls = parse(CALL, SPEC)
    assert content is None and len(calls) == 1
    assert calls[0].name == "get_weather" and calls[0].id.startswith("call_")
    assert json.loads(calls[0].arguments) == {"city": "Oslo", "unit": "celsius"}


def test_many_calls_and_the_text_around_them() -> None:
    text = ('Let me look.\n<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}'
            '</tool_call>\n' + CALL)
    content, calls = parse(text, SPEC)
    assert content == "Let me look." and [c.name for c in calls] == ["get_time",
                                                                      "get_weather"]
    assert len({c.id for c in calls}) == 2
    # arguments written as a JSON string are read as the object they hold
    _, calls = parse('<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"X\\"}"}'
                     '</tool_call>', SPEC)
    assert json.loads(calls[0].arguments) == {"zone": "X"}
    # parallel_tool_calls: false takes the first call; the rest stays text
    one = Tools(SPEC.functions, parallel=False)
    content, calls = parse(text, one)
    assert [c.name for c in calls] == ["get_time"] and content is not None and CALL in content


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call>',  # not a tool
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}',  # never closed
])
def test_malformed_text_stays_content(text: str) -> None:
    assert parse(text, SPEC) == (text, [])
    body = rewrite_completion(ChatAnswer.of_text("m", text, "stop", 3, 4), SPEC).body()
    message = body["choices"][0]["message"]
    assert message["content"] == text and "tool_calls" not in message
    assert body["choices"][0]["finish_reason"] == "stop"


def test_a_completion_with_calls_is_the_sdks() -> None:
    body = rewrite_completion(ChatAnswer.of_text("m", "ok " + CALL, "stop", 3, 4), SPEC).body()
    parsed = strict(ChatCompletion, body)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "ok"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    # cut by the token limit: the calls read back, the reason kept
    cut = rewrite_completion(ChatAnswer.of_text("m", CALL, "length", 3, 4), SPEC).body()
    assert cut["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_text_gives_the_same_calls(size: int) -> None:
    text = "Sure <b>.\n" + CALL + "\n" + CALL.replace("Oslo", "Lima") + "\n"
    s = CallStream(SPEC)
    out: list[Any] = []
    for i in range(0, len(text), size):
        out += s.feed(text[i:i + size])
    out += s.finish()
    texts = "".join(x for x in out if isinstance(x, str))
    calls = [x for x in out if not isinstance(x, str)]
    assert texts.rstrip() == "Sure <b>."  # the space before a call may be left out
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Oslo", "Lima"]
    # no call: every character comes back, a '<tool_call' prefix at the end included
    s = CallStream(SPEC)
    plain = "a < b <tool_ca"
    got = [x for i in range(0, len(plain), size) for x in s.feed(plain[i:i + size])]
    assert "".join(str(x) for x in got + s.finish()) == plain


def test_stream_chunks_assemble_in_the_sdk() -> None:
    """The chunks of a streamed answer with calls, as the SDK's stream accumulator
    (``client.chat.completions.stream``) rebuilds them."""
    w, calls = ChunkWriter("m", True), ChunkCalls(SPEC)
    first = w.first()
    assert first is not None
    chunks = calls.rewrite(first)
    text = "Checking. " + CALL
    for i in range(0, len(text), 5):
        chunks += calls.rewrite(w.delta(text[i:i + 5]))
    chunks += calls.rewrite(w.finish("stop"))
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(strict(ChatCompletionChunk, c))
    final = state.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking. "
    assert [t.function.name for t in choice.message.tool_calls or []] == ["get_weather"]
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] == "Oslo"


# The request ------------------------------------------------------------------------------------


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "weather?"}], **kw}


def test_what_a_tools_request_takes() -> None:
    req = parse_generation(CHAT, chat(
        tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, messages=[
            {"role": "user", "content": "time?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": [{"type": "text", "text": "12:00"}]}]))
    tools = tools_of(req.model_dump(exclude_none=True))
    assert tools is not None and tools.choice == "get_time" and not tools.parallel
    assert req.messages[2].content == "12:00" and req.uses_tools()
    assert tools_of(chat(tools=TOOLS, tool_choice="none")) is None
    assert tools_of(chat(tools=TOOLS)) == Tools(SPEC.functions[:0] + tools_of(
        chat(tools=TOOLS)).functions, "auto", True)  # type: ignore[union-attr]


@pytest.mark.parametrize(("body", "param", "code"), [
    (chat(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools.0.type",
     "unsupported_parameter"),
    (chat(tools=TOOLS, tool_choice={"type": "allowed_tools", "allowed_tools": {}}),
     "tool_choice", "unsupported_parameter"),
    (chat(tool_choice="required"), "tool_choice", None),
    (chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice", None),
    (chat(tools=[TOOLS[0], TOOLS[0]]), "tools", None),
    (chat(tools=[{"type": "function", "function": {"name": "has space"}}]),
     "tools.0.function.name", None),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "#/nowhere"}}}]), "tools.0.function.parameters", None),
    (chat(tools=[{"type": "function", "function": {"name": "f", "extra": 1}}]),
     "tools.0.function.extra", "unknown_parameter"),
    (chat(messages=[{"role": "tool", "content": "4"}]), "messages.0", None),
    (chat(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
     "tool_choice", None),
])
def test_bad_tools_requests_are_400s_naming_the_field(body: dict[str, Any], param: str,
                                                      code: str | None) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_generation(CHAT, body)
    assert e.value.status == 400 and e.value.param == param, e.value.message
    if code is not None:
        assert e.value.code == code


def test_the_catalog_refuses_tools_for_a_model_whose_template_does_not_render_them() -> None:
    from jobs.fleet.catalog import Catalog, ModelInfo

    models = Catalog([ModelInfo("plain", "chat", False), ModelInfo("hermes", "chat", True),
                      ModelInfo("unknown", "chat", None)])
    for body in (chat(model="plain", tools=TOOLS), chat(model="plain", messages=[
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "c", "content": "4"}])):
        with pytest.raises(InvalidRequest) as e:
            parse_generation(CHAT, body, models)
        assert (e.value.param, e.value.code) == ("tools", "unsupported_parameter")
        assert "'plain'" in e.value.message
    with pytest.raises(InvalidRequest):
        parse_responses({"model": "plain", "input": "x", "tools": [
            {"type": "function", "name": "f", "parameters": None, "strict": None}]}, models)
    parse_generation(CHAT, chat(model="plain"), models)  # without tools it serves as ever
    for name in ("hermes", "unknown"):  # unknown: the worker that renders it decides
        parse_generation(CHAT, chat(model=name, tools=TOOLS), models)


def test_parquet_rows_carry_the_calls() -> None:
    from jobs.batches import outputs

    body = rewrite_completion(ChatAnswer.of_text("m", CALL, "stop", 3, 4), SPEC).body()
    row = outputs.parquet_row(CHAT, orjson.loads(outputs.ok_line("a", body)))
    assert row["content"] is None and row["finish_reason"] == "tool_calls"
    assert json.loads(row["tool_calls"])[0]["function"]["name"] == "get_weather"
    req = parse_responses({"model": "m", "input": "x", "tools": [
        {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": None}]})
    line = orjson.loads(outputs.ok_line("b", response_body(req, CALL, "stop", 3, 4)))
    row = outputs.parquet_row(RESPONSES, line)
    assert json.loads(row["tool_calls"])[0]["function"]["name"] == "get_weather"


# The grammar ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    from workers.models.importers import converted_dir, smollm2_gguf

    return converted_dir(default_cache_dir(), "SmolLM2-135M-Instruct", "1", smollm2_gguf())


@pytest.fixture(scope="module")
def ll_tokenizer(smol_dir: Path) -> Any:
    import llguidance.hf
    from transformers import AutoTokenizer

    return llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(str(smol_dir)))


def accepts(ll_tokenizer: Any, tools: Tools, text: str) -> bool:
    import llguidance

    constraint = tools.constraint()
    assert constraint is not None
    m = llguidance.LLMatcher(ll_tokenizer, constraint.grammar())
    ok = m.consume_tokens(ll_tokenizer.tokenize_str(text))
    return bool(ok) and m.is_accepting() and not m.is_error()


def test_the_grammar_compiles() -> None:
    import llguidance

    for tools in (Tools(SPEC.functions, "required"), Tools(SPEC.functions, "get_time"),
                  Tools(SPEC.functions, "required", parallel=False),
                  Tools((Function("noargs", None, None),), "required")):
        constraint = tools.constraint()
        assert constraint is not None and constraint.lark is not None
        grammar = llguidance.grammar_from("lark", constraint.grammar())
        assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    assert Tools(SPEC.functions, "auto").constraint() is None


def test_required_and_named_allow_exactly_their_calls(ll_tokenizer: Any) -> None:
    time_call = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    weather = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", '
               '"unit": "celsius"}}</tool_call>')
    required = Tools(SPEC.functions, "required")
    assert accepts(ll_tokenizer, required, time_call)
    assert accepts(ll_tokenizer, required, weather + "\n" + time_call)
    assert not accepts(ll_tokenizer, required, "Hello")
    assert not accepts(ll_tokenizer, required, weather.replace("Oslo", "Rome"))  # not in enum
    assert not accepts(ll_tokenizer, required, time_call.replace("get_time", "get_date"))
    one = Tools(SPEC.functions, "required", parallel=False)
    assert accepts(ll_tokenizer, one, weather)
    assert not accepts(ll_tokenizer, one, weather + "\n" + time_call)
    named = Tools(SPEC.functions, "get_time")
    assert accepts(ll_tokenizer, named, time_call)
    assert not accepts(ll_tokenizer, named, weather)


# A model whose template renders tools ----------------------------------------------------------


def test_which_templates_render_tools(smol_dir: Path) -> None:
    assert renders_tools(HERMES)
    assert not renders_tools((smol_dir / "chat_template.jinja").read_text())
    assert not renders_tools(None) and not renders_tools("")


@pytest.fixture(scope="module")
def tool_llama(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama: SmolLM2's tokenizer, the Hermes template above."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tool-llama")
    shutil.copytree(smol_dir, path, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
        "config.json", "*.safetensors", "chat_template.jinja", ".*"))
    (path / "chat_template.jinja").write_text(HERMES)
    tok = AutoTokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def engine(tool_llama: Path) -> Any:
    from workers.engines.generation.engine import GenerationEngine
    from workers.models.chat import ChatModel

    e = GenerationEngine(ChatModel("tool-llama", tool_llama))
    yield e
    e.stop()


def ask(engine: Any, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    from workers.engines.request import build_request
    from workers.engines.responses import generation_body
    from workers.engines.sinks import Collect

    c = Collect()
    engine.submit(build_request(engine.model, CHAT, body), c, 2)
    c.result(600)
    out = generation_body(CHAT, "tool-llama", c.choices, None, c.usage.prompt_tokens,
                          c.usage.completion_tokens, tools_of(body))
    return out, c


def test_the_template_renders_the_tools_and_the_history(engine: Any) -> None:
    from workers.engines.request import build_request

    body = chat(tools=TOOLS, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    prompt = engine.model.tokenizer.decode(build_request(engine.model, CHAT, body).prompt)
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    none = build_request(engine.model, CHAT, {**body, "tool_choice": "none"})
    assert "<tools>" not in engine.model.tokenizer.decode(none.prompt)


@pytest.mark.parametrize("choice", ["required", "get_time", "get_weather"])
def test_a_required_or_named_call_always_validates(engine: Any, choice: str) -> None:
    tool_choice: Any = choice if choice == "required" else {
        "type": "function", "function": {"name": choice}}
    for seed in range(3):
        body, c = ask(engine, chat(tools=TOOLS, tool_choice=tool_choice, seed=seed,
                                   temperature=1.0, max_tokens=200, parallel_tool_calls=False))
        choice_out = body["choices"][0]
        assert choice_out["finish_reason"] == "tool_calls", c.text
        calls = choice_out["message"]["tool_calls"]
        assert choice_out["message"]["content"] is None and len(calls) == 1
        name = calls[0]["function"]["name"]
        assert name == choice or choice == "required"
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), SCHEMAS[name])
        strict(ChatCompletion, body)


def test_auto_is_free_text(engine: Any) -> None:
    body, c = ask(engine, chat(tools=TOOLS, seed=1, max_tokens=8))
    assert body["choices"][0]["message"]["content"] == c.text  # random weights: no call


def test_a_model_without_tool_support_is_refused(smol_dir: Path) -> None:
    from workers.engines.request import build_request
    from workers.models.chat import ChatTokens

    smol = ChatTokens("SmolLM2-135M-Instruct", smol_dir)
    for body in (chat(tools=TOOLS), chat(messages=[
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "c", "content": "4"}])):
        with pytest.raises(InvalidRequest) as e:
            build_request(smol, CHAT, body)
        assert (e.value.status, e.value.code) == (400, "unsupported_parameter")
        assert "SmolLM2-135M-Instruct" in e.value.message and "chat template" in \
            e.value.message
    assert build_request(smol, CHAT, chat()).prompt  # without tools it serves as ever


# The Responses API ------------------------------------------------------------------------------

R_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
            "parameters": WEATHER, "strict": True}]


def test_responses_items_run_as_chat_messages() -> None:
    req = parse_responses({"model": "m", "tools": R_TOOLS, "tool_choice": {
        "type": "function", "name": "get_weather"}, "parallel_tool_calls": False, "input": [
        {"role": "user", "content": "weather in Oslo?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Oslo", "unit": "celsius"}', "id": "fc_1",
         "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]})
    body = chat_body(req)
    assert body["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]}
    assert body["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert parse_generation(CHAT, body).tools  # a valid chat body


def test_a_response_with_a_call() -> None:
    req = parse_responses({"model": "m", "input": "weather?", "tools": R_TOOLS})
    out = strict(Response, response_body(req, CALL, "stop", 5, 9))
    assert out.status == "completed" and [i.type for i in out.output] == ["function_call"]
    item = out.output[0]
    assert item.name == "get_weather" and item.call_id.startswith("call_")
    assert json.loads(item.arguments) == {"city": "Oslo", "unit": "celsius"}
    assert out.tool_choice == "auto" and out.tools[0].name == "get_weather"
    text = strict(Response, response_body(req, "Just text.", "stop", 5, 3))
    assert [i.type for i in text.output] == ["message"] and text.output_text == "Just text."


def test_streamed_response_events_with_a_call() -> None:
    from openai.lib.streaming.responses._responses import ResponseStreamState

    req = parse_responses({"model": "m", "input": "weather?", "tools": R_TOOLS,
                           "stream": True})
    w = EventWriter(req)
    evs = [*w.start()]
    text = "One moment. " + CALL
    for i in range(0, len(text), 4):
        evs += w.delta(text[i:i + 4])
    evs += w.finish("stop", 5, 9)
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    names = [n for n, _ in evs]
    assert names.index("response.function_call_arguments.delta") < names.index(
        "response.function_call_arguments.done") < names.index("response.completed")
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for _, data in evs:
        state.handle_event(strict(ResponseStreamEvent, data))
    final = strict(Response, evs[-1][1]["response"])
    assert [i.type for i in state._completed_response.output] == [  # type: ignore[union-attr]
        "message", "function_call"]
    assert [i.type for i in final.output] == ["message", "function_call"]
    assert final.output_text == "One moment. "
    assert json.loads(final.output[1].arguments)["city"] == "Oslo"  # type: ignore[union-attr]
