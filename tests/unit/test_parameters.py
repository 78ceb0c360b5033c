"""The request parameters (jobs.protocol.parameters.PARAMETERS) against the pinned openai SDK and
docs/API.md: every parameter of the SDK's three create methods, and every field of the
objects inside a chat body, is in the table; the table is the documentation's; and the
validation does what the table says: a refused parameter, or one sent at a value other
than its no-op, is an InvalidRequest naming it, a no-op value and null are taken and
leave nothing behind, and a name the endpoint has not is refused."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from openai.resources.chat.completions import Completions as ChatCompletions
from openai.resources.completions import Completions
from openai.resources.embeddings import Embeddings
from openai.resources.responses import Responses
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionContentPartTextParam,
    ChatCompletionDeveloperMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
    ChatCompletionStreamOptionsParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import (
    EasyInputMessageParam,
    FunctionToolParam,
    ResponseFunctionToolCallParam,
    ResponseInputTextParam,
    ResponseOutputMessageParam,
    ResponseOutputTextParam,
    ResponseTextConfigParam,
    response_create_params,
    response_input_param,
)

from jobs.core.errors import InvalidRequest
from jobs.protocol import parameters as table
from jobs.protocol.batch import BatchCreate
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from jobs.protocol.generation import ChatBody, Message, StreamOptions
from jobs.protocol.parsing import BODIES, parse_embeddings, parse_generation, parse_responses
from jobs.protocol.responses_request import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    InputPart,
    ResponseStreamOptions,
    TextConfig,
)
from jobs.protocol.validation import parse_model

API_MD = Path(__file__).resolve().parents[2] / "docs" / "API.md"
TRANSPORT = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
SDK_METHODS = {CHAT: ChatCompletions.create, COMPLETIONS: Completions.create,
               EMBEDDINGS: Embeddings.create, RESPONSES: Responses.create}
SDK_BASES = {CHAT: chat_create_params.CompletionCreateParamsBase,
             COMPLETIONS: completion_create_params.CompletionCreateParamsBase,
             EMBEDDINGS: embedding_create_params.EmbeddingCreateParams,
             RESPONSES: response_create_params.ResponseCreateParamsBase}
ROLE_TYPES = {"system": ChatCompletionSystemMessageParam,
              "developer": ChatCompletionDeveloperMessageParam,
              "user": ChatCompletionUserMessageParam,
              "assistant": ChatCompletionAssistantMessageParam,
              "tool": ChatCompletionToolMessageParam}
MSGS = [{"role": "user", "content": "hi"}]
MINIMAL = {CHAT: {"model": "m", "messages": MSGS}, COMPLETIONS: {"model": "m", "prompt": "hi"},
           EMBEDDINGS: {"model": "m", "input": "hi"}, RESPONSES: {"model": "m", "input": "hi"}}
# Values clients send for what inferq does not do (each is refused naming its parameter)
REAL_USES: list[tuple[str, str, Any]] = [
    (CHAT, "reasoning_effort", "low"),
    (CHAT, "store", True), (CHAT, "prediction", {"type": "content", "content": "x"}),
    (CHAT, "modalities", ["text", "audio"]), (CHAT, "functions", [{"name": "f"}]),
    (CHAT, "function_call", "auto"), (CHAT, "service_tier", "flex"),
    (CHAT, "metadata", {"k": "v"}), (CHAT, "audio", {"voice": "alloy", "format": "mp3"}),
    (COMPLETIONS, "suffix", "!"),
    # JSON types are strict: a string is no boolean, nor is a number
    (CHAT, "store", "false"), (CHAT, "store", 0),
    (RESPONSES, "store", True), (RESPONSES, "previous_response_id", "resp_1"),
    (RESPONSES, "reasoning", {"effort": "low"}), (RESPONSES, "truncation", "auto"),
    (RESPONSES, "include", ["message.output_text.logprobs"]), (RESPONSES, "top_logprobs", 2),
    (RESPONSES, "background", True), (RESPONSES, "conversation", "conv_1"),
    (RESPONSES, "prompt", {"id": "pmpt_1"}), (RESPONSES, "service_tier", "flex"),
    (RESPONSES, "max_tool_calls", 3), (RESPONSES, "safety_identifier", "u1"),
    (RESPONSES, "prompt_cache_key", "k"), (RESPONSES, "store", "false"),
]


def parse(endpoint: str, body: dict[str, Any]) -> Any:
    if endpoint == RESPONSES:
        return parse_responses(body)
    return (parse_embeddings(body, 2048) if endpoint == EMBEDDINGS
            else parse_generation(endpoint, body))


def refused(endpoint: str, body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        parse(endpoint, body)
    assert e.value.param and e.value.message.startswith(f"{e.value.param}: "), e.value.message
    return e.value


def sdk_parameters(endpoint: str) -> list[str]:
    return [p for p in inspect.signature(SDK_METHODS[endpoint]).parameters
            if p not in TRANSPORT]


def implemented(fields: dict[str, table.Param]) -> set[str]:
    """The names of a table's implemented rows."""
    return {name for name, p in fields.items() if p.status == table.IMPLEMENTED}


def rows(markdown: str) -> list[list[str]]:
    """The cells of a Markdown table's rows, its header and rule left out."""
    out = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
           for line in markdown.splitlines() if line.startswith("|")]
    return [r for r in out[2:]]


def docs_block() -> str:
    text = API_MD.read_text()
    m = re.search(r"<!-- parameters: generated by "
                  r"jobs\.protocol\.parameters\.parameter_table\(\) -->\n"
                  r"(.*?)<!-- parameters: end -->", text, re.S)
    assert m, "docs/API.md has no parameter table"
    return m.group(1)


# The table is the SDK's ------------------------------------------------------------------

@pytest.mark.parametrize("endpoint", list(table.PARAMETERS))
def test_the_table_has_every_parameter_of_the_sdk_method(endpoint: str) -> None:
    assert list(table.PARAMETERS[endpoint]) == sdk_parameters(endpoint)
    # the request body's TypedDict says the same (``stream`` is the streaming variants')
    assert set(SDK_BASES[endpoint].__annotations__) | (
        {"stream"} if endpoint != EMBEDDINGS else set()) == set(table.PARAMETERS[endpoint])


def test_the_message_fields_are_the_sdks_by_role() -> None:
    for role, typed in ROLE_TYPES.items():
        assert set(table.ROLE_FIELDS[role]) == set(typed.__annotations__), role
    assert set().union(*table.ROLE_FIELDS.values()) == set(table.MESSAGE_FIELDS)
    roles = set()
    for typed in typing.get_args(ChatCompletionMessageParam):
        roles |= set(typing.get_args(typing.get_type_hints(typed)["role"]))
    assert roles == set(table.ROLE_FIELDS) | set(table.REFUSED_ROLES)
    assert set(table.TEXT_PART_FIELDS) == set(ChatCompletionContentPartTextParam.__annotations__)
    assert set(table.STREAM_OPTIONS) == set(ChatCompletionStreamOptionsParam.__annotations__)


def test_the_tool_objects_are_the_sdks() -> None:
    """Function tools, their calls and outputs: the fields of the SDK's types."""
    assert set(table.TOOL_FIELDS) == set(ChatCompletionFunctionToolParam.__annotations__)
    assert set(table.FUNCTION_FIELDS) == set(
        typing.get_type_hints(ChatCompletionFunctionToolParam)["function"].__annotations__)
    assert set(table.RESPONSES_TOOL_FIELDS) == set(typing.get_type_hints(FunctionToolParam)) | {
        "async"}
    assert set(table.FUNCTION_CALL_FIELDS) == set(typing.get_type_hints(
        ResponseFunctionToolCallParam)) | {"async"}
    assert set(table.FUNCTION_CALL_OUTPUT_FIELDS) == set(
        response_input_param.FunctionCallOutput.__annotations__)
    for fields, model in ((table.FUNCTION_CALL_FIELDS, FunctionCallItem),
                         (table.FUNCTION_CALL_OUTPUT_FIELDS, FunctionCallOutputItem)):
        assert implemented(fields) == set(model.model_fields), model


def test_the_responses_objects_are_the_sdks() -> None:
    """An input message item's fields by role are those of the SDK's message item types
    that take the role; text parts, ``text`` and ``stream_options`` likewise."""
    items = (EasyInputMessageParam, response_input_param.Message, ResponseOutputMessageParam)
    for role, fields in table.ITEM_ROLE_FIELDS.items():
        expected: set[str] = set()
        for typed in items:
            if role in typing.get_args(typing.get_type_hints(typed)["role"]):
                expected |= set(typed.__annotations__)
        assert set(fields) == expected, role
    assert set().union(*table.ITEM_ROLE_FIELDS.values()) == set(table.INPUT_ITEM_FIELDS)
    for part, typed_part in (("input_text", ResponseInputTextParam),
                             ("output_text", ResponseOutputTextParam)):
        assert set(table.PART_TYPE_FIELDS[part]) == set(typed_part.__annotations__), part
    assert set().union(*table.PART_TYPE_FIELDS.values()) == set(table.INPUT_PART_FIELDS)
    assert set(table.TEXT_CONFIG) == set(ResponseTextConfigParam.__annotations__)
    assert set(table.RESPONSE_STREAM_OPTIONS) == set(
        response_create_params.StreamOptions.__annotations__)


def test_implemented_is_exactly_what_the_models_read() -> None:
    """The one fact: a model field is an implemented row and the other way round."""
    for endpoint, fields in table.PARAMETERS.items():
        assert implemented(fields) == set(BODIES[endpoint].model_fields), endpoint
    for fields, model in ((table.MESSAGE_FIELDS, Message),
                          (table.STREAM_OPTIONS, StreamOptions),
                          (table.INPUT_ITEM_FIELDS, InputItem),
                          (table.INPUT_PART_FIELDS, InputPart),
                          (table.TEXT_CONFIG, TextConfig),
                          (table.RESPONSE_STREAM_OPTIONS, ResponseStreamOptions)):
        assert implemented(fields) == set(model.model_fields), model
    for fields in (*table.PARAMETERS.values(), *table.NESTED.values()):
        for name, p in fields.items():
            assert p.status in (table.IMPLEMENTED, table.DEFAULT_ONLY, table.REFUSED), name
            assert bool(p.noop) == (p.status == table.DEFAULT_ONLY), name
            assert p.note and "|" not in p.note, name


# The table is the documentation's --------------------------------------------------------

def test_docs_api_md_holds_the_table() -> None:
    block = docs_block()
    assert block == table.parameter_table(), (
        "docs/API.md's parameter tables differ from jobs.protocol.parameters; paste "
        "jobs.protocol.parameters.parameter_table()'s output between the markers")
    params, nested = block.split("\n\n")
    by_method = {v: k for k, v in table.METHODS.items()}
    documented: dict[str, dict[str, str]] = {endpoint: {} for endpoint in table.PARAMETERS}
    for method, name, status, _accepted, _note in rows(params):
        documented[by_method[method]][name] = status
    for endpoint in table.PARAMETERS:
        assert list(documented[endpoint]) == sdk_parameters(endpoint)
        assert documented[endpoint] == {k: p.status for k, p in table.PARAMETERS[endpoint].items()}
    fields: dict[str, dict[str, str]] = {}
    for obj, name, status, _accepted, _note in rows(nested):
        fields.setdefault(obj, {})[name] = status
    assert fields == {obj: {k: p.status for k, p in t.items()} for obj, t in table.NESTED.items()}


def test_the_documented_example_message_is_the_one_sent() -> None:
    e = refused(CHAT, {**MINIMAL[CHAT], "store": True})
    assert f"(`{e.message}`)" in " ".join(API_MD.read_text().split())


# The validation does what the table says -------------------------------------------------

NOT_A_NOOP = {"on": [1, 2]}  # no parameter's no-op value
CASES = [(endpoint, name) for endpoint, fields in table.PARAMETERS.items()
         for name, p in fields.items() if p.status != table.IMPLEMENTED]


@pytest.mark.parametrize(("endpoint", "name"), CASES, ids=[f"{e} {n}" for e, n in CASES])
def test_each_parameter_not_implemented_is_refused_naming_it(endpoint: str, name: str) -> None:
    e = refused(endpoint, {**MINIMAL[endpoint], name: NOT_A_NOOP})
    assert (e.param, e.code, e.status) == (name, "unsupported_parameter", 400)
    assert e.to_dict()["type"] == "invalid_request_error"
    assert name in e.message.split(":", 1)[1] or table.PARAMETERS[endpoint][name].note in e.message


@pytest.mark.parametrize(("endpoint", "name", "value"), REAL_USES,
                         ids=[f"{e} {n} {v!r}" for e, n, v in REAL_USES])
def test_what_clients_send_for_them_is_refused(endpoint: str, name: str, value: Any) -> None:
    e = refused(endpoint, {**MINIMAL[endpoint], name: value})
    assert (e.param, e.code) == (name, "unsupported_parameter")


NOOPS = [(endpoint, name, v) for endpoint, fields in table.PARAMETERS.items()
         for name, p in fields.items() if p.status != table.IMPLEMENTED for v in (*p.noop, None)]


@pytest.mark.parametrize(("endpoint", "name", "value"), NOOPS,
                         ids=[f"{e} {n} {v!r}" for e, n, v in NOOPS])
def test_a_no_op_value_or_null_is_taken_and_left_out(endpoint: str, name: str,
                                                     value: Any) -> None:
    req = parse(endpoint, {**MINIMAL[endpoint], name: value})
    assert req.model_fields_set == set(MINIMAL[endpoint])
    assert name not in req.model_dump(exclude_unset=True)


def test_integers_for_zero_numbers_are_zero() -> None:
    for value in (0, 0.0, -0.0):
        parse_generation(CHAT, {**MINIMAL[CHAT], "presence_penalty": value,
                                "frequency_penalty": value})


def test_null_is_the_default_of_an_implemented_parameter() -> None:
    req = parse_generation(CHAT, {**MINIMAL[CHAT], "temperature": None, "top_p": None,
                                  "stream": None, "max_tokens": None, "seed": None,
                                  "stop": None, "stream_options": None, "user": None})
    assert (req.temperature, req.top_p, req.stream, req.token_limit()) == (1.0, 1.0, False,
                                                                          None)
    assert parse_embeddings({**MINIMAL[EMBEDDINGS], "encoding_format": None,
                             "dimensions": None}, 8).encoding_format == "float"
    # a required one is not optional: null is its wrong type
    assert refused(CHAT, {"model": None, "messages": MSGS}).param == "model"
    assert refused(CHAT, {"model": "m", "messages": None}).param == "messages"


@pytest.mark.parametrize("endpoint", list(table.PARAMETERS))
def test_an_unknown_parameter_is_refused_naming_it(endpoint: str) -> None:
    e = refused(endpoint, {**MINIMAL[endpoint], "temprature": 0.5})
    assert (e.param, e.code) == ("temprature", "unknown_parameter")
    assert e.message == (f"temprature: unknown parameter: {endpoint} has no parameter "
                         "'temprature'")


def test_another_endpoints_parameter_is_unknown() -> None:
    e = refused(COMPLETIONS, {**MINIMAL[COMPLETIONS], "max_completion_tokens": 4})
    assert (e.param, e.code) == ("max_completion_tokens", "unknown_parameter")
    assert refused(EMBEDDINGS, {**MINIMAL[EMBEDDINGS], "temperature": 0}).code == \
        "unknown_parameter"
    assert refused(CHAT, {**MINIMAL[CHAT], "echo": False}).code == "unknown_parameter"


def test_the_message_says_what_is_taken_and_why() -> None:
    e = refused(CHAT, {**MINIMAL[CHAT], "service_tier": "flex"})
    assert e.message == ("service_tier: unsupported parameter: inferq takes service_tier "
                         "only as \"auto\" or \"default\" or null, got a string ('flex'): a "
                         "realtime request runs in the default tier (flex is a batch option)")
    e = refused(CHAT, {**MINIMAL[CHAT], "functions": []})
    assert e.message == ("functions: unsupported parameter: the deprecated functions are not "
                         "implemented: use `tools` (see Tool calls); leave functions out (or "
                         "null)")


# Inside a chat body ----------------------------------------------------------------------

def chat(*messages: Any, **params: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **params}


@pytest.mark.parametrize(("message", "param", "code"), [
    ({"role": "user", "content": "hi", "weight": 2}, "messages.1.weight", "unknown_parameter"),
    ({"role": "user", "content": "hi", "refusal": None}, "messages.1.refusal",
     "unknown_parameter"),  # not a field of a user message
    ({"role": "tool", "content": "42", "tool_call_id": "call_1", "name": "f"},
     "messages.1.name", "unknown_parameter"),  # not a field of a tool message
    ({"role": "function", "content": "42", "name": "f"}, "messages.1.role",
     "unsupported_parameter"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "custom", "custom": {"name": "f", "input": "x"}}]},
     "messages.1.tool_calls.0.type", "unsupported_parameter"),
    ({"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
     "messages.1.function_call", "unsupported_parameter"),
    ({"role": "assistant", "content": "no", "refusal": "I can't"}, "messages.1.refusal",
     "unsupported_parameter"),
    ({"role": "assistant", "audio": {"id": "a"}}, "messages.1.audio", "unsupported_parameter"),
    ({"role": "user", "content": [{"type": "text", "text": "a"},
                                  {"type": "image_url", "image_url": {"url": "x"}}]},
     "messages.1.content.1.type", "unsupported_parameter"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
     "messages.1.content.0.type", "unsupported_parameter"),
    ({"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]},
     "messages.1.content.0.type", "unsupported_parameter"),
    ({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
     "messages.1.content.0.type", "unsupported_parameter"),
    ({"role": "system", "content": [{"type": "text", "text": "a",
                                     "prompt_cache_breakpoint": {"mode": "explicit"}}]},
     "messages.1.content.0.prompt_cache_breakpoint", "unsupported_parameter"),
    ({"role": "user", "content": [{"type": "text", "text": "a", "cache": True}]},
     "messages.1.content.0.cache", "unknown_parameter"),
])
def test_inside_messages_the_same(message: dict[str, Any], param: str, code: str) -> None:
    e = refused(CHAT, chat({"role": "system", "content": "be brief"}, message))
    assert (e.param, e.code) == (param, code), e.message
    with pytest.raises(InvalidRequest) as job:  # a batch default (or line) alike
        parse_model(BatchCreate, {"input_file_id": "f", "endpoint": CHAT,
                                  "completion_window": "24h",
                                  "body": chat({"role": "user", "content": "x"}, message)})
    assert (job.value.param, job.value.code) == ("body." + param, code)


def test_what_a_message_takes() -> None:
    """An assistant message as the SDK returns it (its nulls), text parts, a name."""
    req = parse_generation(CHAT, chat(
        {"role": "developer", "content": [{"type": "text", "text": "be "},
                                          {"type": "text", "text": "brief",
                                           "prompt_cache_breakpoint": None}]},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "hello", "refusal": None, "tool_calls": None,
         "function_call": None, "audio": None, "name": None},
        {"role": "user", "content": "and?"}))
    assert isinstance(req, ChatBody)
    assert [m.content for m in req.messages] == ["be brief", "hi", "hello", "and?"]
    assert req.messages[2].model_fields_set == {"role", "content"}


def test_stream_options() -> None:
    req = parse_generation(CHAT, chat(*MSGS, stream=True, stream_options={
        "include_usage": True, "include_obfuscation": False}))
    assert req.include_usage()
    e = refused(CHAT, chat(*MSGS, stream=True, stream_options={"include_obfuscation": True}))
    assert (e.param, e.code) == ("stream_options.include_obfuscation", "unsupported_parameter")
    e = refused(COMPLETIONS, {**MINIMAL[COMPLETIONS], "stream": True,
                              "stream_options": {"usage": True}})
    assert (e.param, e.code) == ("stream_options.usage", "unknown_parameter")


# A batch's defaults ----------------------------------------------------------------------

def batch(endpoint: str, body: dict[str, Any]) -> Any:
    return parse_model(BatchCreate, {"input_file_id": "file-x", "endpoint": endpoint,
                                     "completion_window": "24h", "body": body})


def test_batch_defaults_are_judged_with_the_batch() -> None:
    ok = batch(CHAT, {"model": "m", "temperature": 0, "max_tokens": 8, "logprobs": False})
    assert ok.body == {"model": "m", "temperature": 0, "max_tokens": 8, "logprobs": False}
    for endpoint, body, param, code in [
        (CHAT, {"model": "m", "store": True}, "body.store", "unsupported_parameter"),
        (CHAT, {"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "body.tools.0.type",
         "unsupported_parameter"),
        (EMBEDDINGS, {"model": "m", "temperature": 0}, "body.temperature", "unknown_parameter"),
        (COMPLETIONS, {"suffix": "!"}, "body.suffix", "unsupported_parameter"),
    ]:
        with pytest.raises(InvalidRequest) as e:
            batch(endpoint, body)
        assert (e.value.param, e.value.code) == (param, code)
        assert e.value.message.startswith(f"{param}: ")


# Inside a Responses body -------------------------------------------------------------------

def responses(*items: Any, **params: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(items), **params}


USER_ITEM = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("body", "param", "code"), [
    (responses(USER_ITEM, {"type": "computer_call_output", "call_id": "c", "output": {}}),
     "input.1.type", "unsupported_parameter"),
    (responses(USER_ITEM, {"type": "function_call_output", "call_id": "c", "output": "4",
                           "name": "f"}), "input.1.name", "unsupported_parameter"),
    (responses(USER_ITEM, tools=[{"type": "web_search"}]), "tools.0.type",
     "unsupported_parameter"),
    (responses(USER_ITEM, tools=[{"type": "function", "name": "f", "parameters": None,
                                  "strict": None, "output_schema": {}}]),
     "tools.0.output_schema", "unsupported_parameter"),
    (responses(USER_ITEM, tool_choice={"type": "web_search_preview"}), "tool_choice",
     "unsupported_parameter"),
    (responses({"type": "item_reference", "id": "msg_1"}), "input.0.type",
     "unsupported_parameter"),
    (responses({"type": "reasoning", "id": "rs_1", "summary": []}), "input.0.type",
     "unsupported_parameter"),
    (responses({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}),
     "input.0.content.0.type", "unsupported_parameter"),
    (responses({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}),
     "input.0.content.0.type", "unsupported_parameter"),
    (responses({"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "refusal", "refusal": "no"}]}),
     "input.0.content.0.type", "unsupported_parameter"),
    (responses({"role": "assistant", "content": [
        {"type": "output_text", "text": "a", "annotations": [{"type": "url_citation"}]}]}),
     "input.0.content.0.annotations", "unsupported_parameter"),
    (responses({"role": "user", "content": [
        {"type": "input_text", "text": "a", "prompt_cache_breakpoint": {"mode": "explicit"}}]}),
     "input.0.content.0.prompt_cache_breakpoint", "unsupported_parameter"),
    (responses({"role": "assistant", "content": "a", "phase": "final_answer"}),
     "input.0.phase", "unsupported_parameter"),
    (responses({"role": "user", "content": "a", "id": "msg_1"}), "input.0.id",
     "unknown_parameter"),  # not a field of a user message
    (responses({"role": "user", "content": [{"type": "input_text", "text": "a",
                                             "annotations": []}]}),
     "input.0.content.0.annotations", "unknown_parameter"),  # not an input_text's field
    (responses(USER_ITEM, text={"verbosity": "low"}), "text.verbosity",
     "unsupported_parameter"),
    (responses(USER_ITEM, stream=True, stream_options={"include_obfuscation": True}),
     "stream_options.include_obfuscation", "unsupported_parameter"),
    (responses(USER_ITEM, stream=True, stream_options={"include_usage": True}),
     "stream_options.include_usage", "unknown_parameter"),  # chat's, not the Responses'
    (responses(USER_ITEM, messages=[USER_ITEM]), "messages", "unknown_parameter"),
    (responses(USER_ITEM, max_tokens=4), "max_tokens", "unknown_parameter"),
])
def test_inside_a_responses_body_the_same(body: dict[str, Any], param: str,
                                          code: str) -> None:
    e = refused(RESPONSES, body)
    assert (e.param, e.code) == (param, code), e.message
    with pytest.raises(InvalidRequest) as b:  # a batch default (or line) alike
        parse_model(BatchCreate, {"input_file_id": "f", "endpoint": RESPONSES,
                                  "completion_window": "24h", "body": body})
    assert (b.value.param, b.value.code) == ("body." + param, code)


def test_what_a_responses_body_takes() -> None:
    """The items an earlier answer gives back (its nulls and no-op values), text
    parts, and the no-op values of ``text`` and ``stream_options``."""
    req = parse_responses(responses(
        {"role": "developer", "content": [{"type": "input_text", "text": "be "},
                                          {"type": "input_text", "text": "brief",
                                           "prompt_cache_breakpoint": None}]},
        {"type": "message", "role": "user", "content": "hi", "status": None, "phase": None},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "phase": None, "content": [{"type": "output_text", "text": "hello",
                                     "annotations": [], "logprobs": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "and?"}]},
        text={"format": {"type": "text"}, "verbosity": None}, stream=True,
        stream_options={"include_obfuscation": False}, metadata={"k": "v"}))
    assert isinstance(req.input, list)
    assert [m.text() for m in req.input] == ["be brief", "hi", "hello", "and?"]
    assert req.input[2].model_fields_set == {"type", "id", "role", "status", "content"}
    assert req.metadata == {"k": "v"} and req.stream


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "input": ""}, "input"), ({"model": "m", "input": []}, "input"),
    ({"model": "m"}, "input"), ({"input": "hi"}, "model"),
    ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "hi", "temperature": 2.5}, "temperature"),
    ({"model": "m", "input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}},
     "metadata"),
    ({"model": "m", "input": "hi", "metadata": {"k": "v" * 513}}, "metadata"),
    ({"model": "m", "input": "hi", "metadata": {"k": 1}}, "metadata.k"),
    ({"model": "m", "input": [{"role": "wizard", "content": "hi"}]}, "input.0.role"),
    ({"model": "m", "input": [{"role": "user"}]}, "input.0.content"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "input.0.content.0.text"),
])
def test_invalid_responses_bodies_name_their_field(body: dict[str, Any], param: str) -> None:
    e = refused(RESPONSES, body)
    assert e.param == param and e.code not in ("unsupported_parameter", "unknown_parameter")
