"""/v1/responses without a server: a Responses request is the chat request
jobs.protocol.responses_request.chat_body makes of it; the Response object and the streamed events
(jobs.protocol.responses) are the pinned SDK's types, strictly validated, and the SDK's own
stream accumulator (what ``client.responses.stream`` runs) rebuilds the answer from the
events; batch lines of Responses count their tokens and fill the Parquet columns."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai._models import validate_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from jobs.batches import outputs
from jobs.core.errors import InvalidRequest
from jobs.fleet import catalog, registry
from jobs.protocol.batch import BatchCreate
from jobs.protocol.endpoints import CHAT, ENDPOINTS, RESPONSES
from jobs.protocol.generation import ChatBody
from jobs.protocol.parsing import parse_generation, parse_responses
from jobs.protocol.responses import EventWriter, response_body
from jobs.protocol.responses_request import as_chat, chat_body
from jobs.protocol.validation import parse_model
from jobs.tenants import token_counts
from workers.engines.responses import response_object

MODEL = "SmolLM2-135M-Instruct"


def req(**body: Any) -> Any:
    return parse_responses({"model": MODEL, **body})


# The chat request a Responses request runs as -----------------------------------------

def test_a_string_input_is_one_user_message() -> None:
    body = chat_body(req(input="What is the capital of France?"))
    assert body == {"model": MODEL, "temperature": 1.0, "top_p": 1.0,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    assert isinstance(parse_generation(CHAT, body), ChatBody)


def test_instructions_come_first_and_settings_carry_over() -> None:
    body = chat_body(req(input="Hi", instructions="Answer in French.", temperature=0,
                         top_p=0.5, max_output_tokens=12, user="u-1", metadata={"k": "v"},
                         store=False, text={"format": {"type": "text"}}))
    assert body["messages"] == [{"role": "system", "content": "Answer in French."},
                                {"role": "user", "content": "Hi"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["user"]) == (
        0, 0.5, 12, "u-1")
    assert set(body) == {"model", "messages", "temperature", "top_p", "max_tokens", "user"}
    chat = parse_generation(CHAT, body)
    assert chat.token_limit() == 12


def test_multi_turn_input_with_an_earlier_answer() -> None:
    earlier = response_body(req(input="Name a colour."), "Blue.", "stop", 9, 2)
    body = chat_body(req(input=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Name a "},
                                     {"type": "input_text", "text": "colour."}]},
        *earlier["output"],  # the output message item, as the SDK gives it back
        {"type": "message", "role": "user", "content": "Another?"}]))
    assert body["messages"] == [{"role": "developer", "content": "Be brief."},
                                {"role": "user", "content": "Name a colour."},
                                {"role": "assistant", "content": "Blue."},
                                {"role": "user", "content": "Another?"}]


def test_as_chat_leaves_other_endpoints_alone() -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert as_chat(CHAT, chat) == (CHAT, chat)
    clean = req(input="hi", max_output_tokens=5).model_dump(exclude_none=True)
    endpoint, body = as_chat(RESPONSES, clean)
    assert endpoint == CHAT and body["max_tokens"] == 5


def test_limits_reserve_what_the_chat_request_would() -> None:
    clean = req(input="hello there", instructions="Be brief.",
                max_output_tokens=7).model_dump(exclude_none=True)
    chat = chat_body(parse_responses(clean))
    assert token_counts.request_tokens(RESPONSES, clean, 1024) == \
        token_counts.request_tokens(CHAT, chat, 1024)
    assert token_counts.prompt_tokens(RESPONSES, clean) == token_counts.prompt_tokens(CHAT, chat)
    assert token_counts.request_tokens(RESPONSES, clean, 1024) - token_counts.prompt_tokens(
        RESPONSES, clean) == 7


def test_the_endpoint_is_served_by_chat_models_and_batches() -> None:
    assert RESPONSES in ENDPOINTS
    assert catalog.kinds_for(RESPONSES) == (registry.CHAT_KIND,)
    cat = catalog.Catalog([catalog.ModelInfo(MODEL, registry.CHAT_KIND),
                           catalog.ModelInfo("emb", registry.EMBEDDINGS_KIND),
                           catalog.ModelInfo("gpt2ish", registry.COMPLETIONS_KIND)])
    parse_responses({"model": MODEL, "input": "hi"}, cat)
    for name in ("emb", "gpt2ish", "nope"):
        with pytest.raises(InvalidRequest) as e:
            parse_responses({"model": name, "input": "hi"}, cat)
        assert (e.value.param, e.value.code) == ("model", "model_not_found")
    b = parse_model(BatchCreate, {"input_file_id": "f", "endpoint": RESPONSES,
                                  "completion_window": "24h",
                                  "body": {"model": MODEL, "instructions": "Be brief."}})
    assert b.endpoint == RESPONSES


# The Response object --------------------------------------------------------------------

def strict(type_: Any, value: Any) -> Any:
    """``value`` as the SDK reads it in strict mode (_strict_response_validation)."""
    return validate_type(type_=type_, value=orjson.loads(orjson.dumps(value)))


def test_a_response_is_the_sdks_response() -> None:
    r = req(input="hi", instructions="Be brief.", metadata={"run": "7"}, temperature=0.2,
            max_output_tokens=30, user="u")
    body = response_body(r, "Hello!", "stop", 11, 3)
    got: Response = strict(Response, body)
    assert got.object == "response" and got.id.startswith("resp_")
    assert got.status == "completed" and got.incomplete_details is None
    assert got.output_text == "Hello!"
    msg = got.output[0]
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.role == "assistant"
    assert msg.status == "completed" and msg.content[0].annotations == []
    assert got.usage is not None and (got.usage.input_tokens, got.usage.output_tokens,
                                      got.usage.total_tokens) == (11, 3, 14)
    assert got.usage.input_tokens_details.cached_tokens == 0
    assert got.usage.output_tokens_details.reasoning_tokens == 0
    assert (got.instructions, got.metadata, got.temperature, got.top_p,
            got.max_output_tokens, got.user) == ("Be brief.", {"run": "7"}, 0.2, 1.0, 30, "u")
    assert (got.tools, got.tool_choice, got.parallel_tool_calls, got.truncation) == (
        [], "none", True, "disabled")
    assert body["store"] is False and got.completed_at is not None


def test_the_token_limit_makes_it_incomplete() -> None:
    got = strict(Response, response_body(req(input="hi", max_output_tokens=2), "Hel", "length",
                                         5, 2))
    assert got.status == "incomplete"
    assert got.incomplete_details.reason == "max_output_tokens"
    assert got.output[0].status == "incomplete" and got.output_text == "Hel"


def test_the_workers_build_the_same_object_from_a_stored_body() -> None:
    clean = req(input="hi", metadata={"a": "b"}).model_dump(mode="json", exclude_unset=True)
    body = response_object(clean, "Yes.", "stop", 4, 2)
    got = strict(Response, body)
    assert got.output_text == "Yes." and got.metadata == {"a": "b"}


def test_the_api_describes_what_it_sends() -> None:
    from jobs.protocol.objects.inference import ResponseObject

    ResponseObject.model_validate(response_body(req(input="hi"), "x", "length", 1, 1))
    ResponseObject.model_validate(response_body(
        req(input="hi", instructions="i", metadata={"k": "v"}, user="u"), "x", "stop", 1, 1))


# The streamed events --------------------------------------------------------------------

ORDER = ["response.created", "response.in_progress", "response.output_item.added",
         "response.content_part.added", "response.output_text.delta",
         "response.output_text.delta", "response.output_text.delta",
         "response.output_text.done", "response.content_part.done",
         "response.output_item.done"]


def events(reason: str = "stop", r: Any = None) -> list[tuple[str, dict[str, Any]]]:
    w = EventWriter(r or req(input="hi", stream=True))
    return [*w.start(), *w.delta("Par"), *w.delta("is"), *w.delta("."),
            *w.finish(reason, 8, 3)]


@pytest.mark.parametrize("reason,last", [("stop", "response.completed"),
                                         ("length", "response.incomplete")])
def test_the_event_sequence(reason: str, last: str) -> None:
    evs = events(reason)
    assert [name for name, _ in evs] == [*ORDER, last]
    assert [data["sequence_number"] for _, data in evs] == list(range(len(evs)))
    assert all(data["type"] == name for name, data in evs)
    parsed = [strict(ResponseStreamEvent, data) for _, data in evs]  # each the SDK's type
    ids = {p.response.id for p in parsed if hasattr(p, "response")}
    assert len(ids) == 1
    items = {p.item_id for p in parsed if hasattr(p, "item_id")}
    assert items == {parsed[2].item.id}
    assert parsed[7].text == "Paris." and parsed[8].part.text == "Paris."
    final = parsed[-1].response
    assert final.status == ("completed" if reason == "stop" else "incomplete")
    assert final.output_text == "Paris." and final.usage.total_tokens == 11
    assert parsed[0].response.status == "in_progress" and parsed[0].response.output == []


def test_the_sdks_stream_accumulator_rebuilds_the_answer() -> None:
    """What client.responses.stream() does with the events: its final response is the
    whole answer, and it sees each delta with the text so far."""
    from openai import omit

    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    snapshots = []
    for _, data in events():
        for ev in state.handle_event(strict(ResponseStreamEvent, data)):
            if ev.type == "response.output_text.delta":
                snapshots.append(ev.snapshot)
    assert snapshots == ["Par", "Paris", "Paris."]
    final = state._completed_response
    assert final is not None and final.output_text == "Paris."


def test_an_error_event() -> None:
    w = EventWriter(req(input="hi", stream=True))
    w.start()
    name, data = w.error({"message": "the worker went away", "type": "server_error",
                          "param": None, "code": "server_error"})
    assert name == "error" and data["sequence_number"] == 4
    got = strict(ResponseStreamEvent, data)
    assert got.type == "error" and got.message == "the worker went away"


# Batch output lines ---------------------------------------------------------------------

def test_response_lines_count_their_tokens_and_fill_parquet_rows() -> None:
    body = response_body(req(input="hi"), "Paris.", "length", 12, 3)
    line = orjson.loads(outputs.ok_line("a", body))
    assert outputs.line_tokens(line) == outputs.Tokens(12, 3)
    row = outputs.parquet_row(RESPONSES, line)
    assert (row["content"], row["finish_reason"], row["prompt_tokens"],
            row["completion_tokens"], row["status_code"]) == ("Paris.", "length", 12, 3, 200)
    assert outputs.parquet_schema(RESPONSES).names == outputs.GENERATION_SCHEMA.names
    err = orjson.loads(outputs.invalid_request_line("b", "input: bad", param="input"))
    assert outputs.parquet_row(RESPONSES, err)["error_message"] == "input: bad"
