"""Parsing a request body at the door: judged by the parameter table first
(``supported``), then read by its endpoint's model (``parse_embeddings``,
``parse_generation``, ``parse_responses``), its model checked against those served.
A generation body's cheap bounds (jobs.protocol.limits: its tools' count first, its
prompt's bytes, its schemas' depth and size) come before its schemas are compiled.

``supported`` judges a body by ``jobs.protocol.parameters``' tables before the model
reads it: anything inferq does not implement and sent at another value is 400
``unsupported_parameter`` naming it, and a name the table does not know is 400
``unknown_parameter``; ``null`` is the same as leaving an optional parameter out. So a
batch line and a direct call are judged alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from jobs.core.errors import InvalidRequest, shown
from jobs.protocol.embeddings import EmbeddingsBody, no_dimensions
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, ServedModels
from jobs.protocol.generation import ChatBody, CompletionBody
from jobs.protocol.limits import check_prompt, check_schemas, check_tool_count
from jobs.protocol.parameters import (
    FUNCTION_FIELDS,
    FUNCTIONS,
    IMPLEMENTED,
    INPUT_ITEM_FIELDS,
    INPUT_PART_FIELDS,
    ITEM_ROLE_FIELDS,
    ITEM_TYPE_FIELDS,
    MESSAGE_FIELDS,
    PARAMETERS,
    PART_TYPE_FIELDS,
    REFUSED_ROLES,
    RESPONSE_STREAM_OPTIONS,
    RESPONSES_TOOL_FIELDS,
    ROLE_FIELDS,
    STREAM_OPTIONS,
    TEXT_CONFIG,
    TEXT_PART_FIELDS,
    TOOL_FIELDS,
    Param,
    noop_json,
)
from jobs.protocol.responses_request import ResponsesBody
from jobs.protocol.tools import no_tools
from jobs.protocol.validation import json_value, parse_model

UNSUPPORTED, UNKNOWN = "unsupported_parameter", "unknown_parameter"
# Each endpoint's model: its fields are exactly the table's implemented parameters.
BODIES: dict[str, type[BaseModel]] = {CHAT: ChatBody, COMPLETIONS: CompletionBody,
                                      EMBEDDINGS: EmbeddingsBody, RESPONSES: ResponsesBody}


def parse_embeddings(body: Any, max_inputs: int,
                     models: ServedModels | None = None) -> EmbeddingsBody:
    """Validate an embeddings body; raises InvalidRequest naming the offending param.

    ``models``: the registry snapshot the model is checked against; None where the
    body was already checked at the door (a worker re-reading it). Inputs longer
    than the model's context are refused by the worker, which holds the tokenizer.
    """
    req: EmbeddingsBody = parse_model(EmbeddingsBody, supported(EMBEDDINGS, body))
    if models is not None:
        info = models.require(req.model, EMBEDDINGS, versions=True)
        if req.dimensions is not None and not info.matryoshka:
            raise no_dimensions(req.model)
    if len(req.inputs()) > max_inputs:
        raise InvalidRequest(f"input: at most {max_inputs} inputs per request", param="input")
    return req


def parse_generation(endpoint: str, body: Any,
                     models: ServedModels | None = None) -> ChatBody | CompletionBody:
    """Validate a chat or completions body (everything that needs no tokenizer).

    ``models``: as for parse_embeddings; the prompt's length is checked by the worker.
    """
    check_tool_count(body)
    req: ChatBody | CompletionBody = parse_model(ChatBody if endpoint == CHAT else
                                                 CompletionBody, supported(endpoint, body))
    if models is not None:
        info = models.require(req.model, endpoint, versions=True)
        if isinstance(req, ChatBody) and req.uses_tools() and info.tools is False:
            raise no_tools(req.model)
        check_prompt(endpoint, body, info)
    check_schemas(req)
    return req


def parse_responses(body: Any, models: ServedModels | None = None) -> ResponsesBody:
    """Validate a Responses body (everything that needs no tokenizer); ``models`` as for
    parse_embeddings."""
    check_tool_count(body)
    req: ResponsesBody = parse_model(ResponsesBody, supported(RESPONSES, body))
    if models is not None:
        info = models.require(req.model, RESPONSES, versions=True)
        if req.uses_tools() and info.tools is False:
            raise no_tools(req.model)
        check_prompt(RESPONSES, body, info)
    check_schemas(req)
    return req


def supported(endpoint: str, body: Any, prefix: str = "") -> Any:
    """``body`` as the endpoint's model reads it: less its nulls (an optional parameter
    sent as null is left out) and the parameters taken at a value that does nothing.
    InvalidRequest (``unsupported_parameter``) for a parameter inferq does not implement
    sent at another value, and (``unknown_parameter``) for a name the endpoint has not;
    ``param`` is where it is (``messages.0.tool_calls``), after ``prefix``. Anything
    that is no object is left for the model to refuse."""
    if not isinstance(body, dict):
        return body
    if endpoint == RESPONSES:
        return _responses_supported(body, prefix)
    fields = BODIES[endpoint].model_fields
    out = _judged(body, PARAMETERS[endpoint], prefix, endpoint,
                  keep_null={k for k, f in fields.items() if f.is_required()})
    if isinstance(out.get("messages"), list):
        out["messages"] = [_message(m, f"{prefix}messages.{i}")
                           for i, m in enumerate(out["messages"])]
    if isinstance(out.get("stream_options"), dict):
        out["stream_options"] = _judged(out["stream_options"], STREAM_OPTIONS,
                                        f"{prefix}stream_options.", "stream_options")
    if endpoint == CHAT:
        _chat_tools(out, prefix)
    return out


def _chat_tools(out: dict[str, Any], prefix: str) -> None:
    """Chat's ``tools`` by TOOL_FIELDS and FUNCTION_FIELDS, in place: function tools
    only, and ``tool_choice`` a function's (OpenAI's allowed-tools and custom choices
    are refused)."""
    if isinstance(out.get("tools"), list):
        out["tools"] = [_tool(t, f"{prefix}tools.{i}") for i, t in enumerate(out["tools"])]
    _function_choice(out.get("tool_choice"), prefix)


def _function_choice(choice: Any, prefix: str) -> None:
    """A ``tool_choice`` object must name a function (OpenAI's allowed-tools and custom
    choices are refused)."""
    if isinstance(choice, dict) and isinstance(choice.get("type"), str) and \
            choice["type"] != "function":
        at = f"{prefix}tool_choice"
        raise InvalidRequest(f"{at}: unsupported parameter: tool_choice of type "
                             f"{shown(choice['type'], 64)} is not supported: function tools "
                             "only (`none`, `auto`, `required` or a named function)",
                             param=at, code=UNSUPPORTED)


def _function_tool(tool: Any, at: str, table: dict[str, Param], keep_null: set[str]) -> Any:
    """One of ``tools`` judged by ``table`` (chat's or the Responses API's fields); a tool
    of another type than function refused."""
    if not isinstance(tool, dict):
        return tool  # the model refuses it
    kind = tool.get("type")
    if isinstance(kind, str) and kind != "function":
        raise InvalidRequest(f"{at}.type: unsupported parameter: tools of type "
                             f"{shown(kind, 64)} are not supported: inferq takes function "
                             "tools only (type 'function')", param=f"{at}.type",
                             code=UNSUPPORTED)
    return _judged(tool, table, f"{at}.", "a function tool", keep_null=keep_null)


def _tool(tool: Any, at: str) -> Any:
    out = _function_tool(tool, at, TOOL_FIELDS, keep_null={"type", "function"})
    if isinstance(out, dict) and isinstance(out.get("function"), dict):
        out["function"] = _judged(out["function"], FUNCTION_FIELDS, f"{at}.function.",
                                  "a function", keep_null={"name"})
    return out


def _judged(obj: dict[str, Any], table: dict[str, Param], prefix: str, what: str,
            keep_null: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """``obj``'s implemented fields (InvalidRequest for the others, unless at a no-op)."""
    out: dict[str, Any] = {}
    for name, value in obj.items():
        param = f"{prefix}{name}"
        p = table.get(name)
        if p is None:
            raise InvalidRequest(f"{param}: unknown parameter: {what} has no parameter "
                                 f"{shown(name, 64)}", param=param, code=UNKNOWN)
        if value is None and name not in keep_null:
            continue
        if p.status == IMPLEMENTED:
            out[name] = value
        elif not any(_same(value, v) for v in p.noop):
            if p.noop:
                raise InvalidRequest(
                    f"{param}: unsupported parameter: inferq takes {name} only as "
                    f"{' or '.join(noop_json(v) for v in p.noop)} or null, got "
                    f"{json_value(value)}: {p.note}", param=param, code=UNSUPPORTED)
            raise InvalidRequest(f"{param}: unsupported parameter: {p.note}; leave {name} "
                                 "out (or null)", param=param, code=UNSUPPORTED)
    return out


def _message(m: Any, at: str) -> Any:
    """One message judged by MESSAGE_FIELDS (its role's fields) and TEXT_PART_FIELDS."""
    if not isinstance(m, dict):
        return m
    role = m.get("role")
    if role in REFUSED_ROLES:
        raise InvalidRequest(f"{at}.role: unsupported parameter: {role} messages are not "
                             f"supported: {FUNCTIONS}", param=f"{at}.role", code=UNSUPPORTED)
    out = _by_role(m, at, ROLE_FIELDS, MESSAGE_FIELDS, "message", _part)
    for j, call in enumerate(out.get("tool_calls") or []):
        if isinstance(call, dict) and isinstance(call.get("type"), str) and \
                call["type"] != "function":
            raise InvalidRequest(f"{at}.tool_calls.{j}.type: unsupported parameter: calls of "
                                 f"type {shown(call['type'], 64)} are not supported: function "
                                 "calls only", param=f"{at}.tool_calls.{j}.type",
                                 code=UNSUPPORTED)
    return out


def _by_role(m: dict[str, Any], at: str, roles: dict[str, tuple[str, ...]],
             table: dict[str, Param], what: str, part: Callable[[Any, str], Any]) -> Any:
    """A message (or message item) judged by its role's fields of ``table``, each of its
    content parts by ``part``; one of a role not in ``roles`` as it is (the model says
    which roles there are)."""
    role = m.get("role")
    if not isinstance(role, str) or role not in roles:
        return m
    fields = {k: table[k] for k in roles[role]}
    out = _judged(m, fields, f"{at}.", f"a {role} {what}", keep_null={"role", "content"})
    if isinstance(out.get("content"), list):
        out["content"] = [part(p, f"{at}.content.{j}") for j, p in enumerate(out["content"])]
    return out


def _text_part(part: Any, at: str, kinds: dict[str, dict[str, Param]],
               keep_null: set[str]) -> Any:
    """A content part of one of ``kinds`` (type -> its fields), judged by its fields; one
    of another type refused (the models read text only)."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        return part  # the model refuses it
    kind = part["type"]
    if kind not in kinds:
        raise InvalidRequest(f"{at}.type: unsupported parameter: content parts of type "
                             f"{shown(kind, 64)} are not supported: the models read text "
                             f"only (parts of type {' or '.join(map(repr, kinds))})",
                             param=f"{at}.type", code=UNSUPPORTED)
    return _judged(part, kinds[kind], f"{at}.", f"a part of type {kind}", keep_null=keep_null)


def _part(part: Any, at: str) -> Any:
    """A chat message's content part (TEXT_PART_FIELDS)."""
    return _text_part(part, at, {"text": TEXT_PART_FIELDS}, keep_null={"text"})


def _same(value: Any, noop: Any) -> bool:
    """``value`` is ``noop`` as JSON types go (see Param): a boolean is no number, a
    number with a fraction no integer."""
    if isinstance(noop, bool) or isinstance(value, bool):
        return type(value) is type(noop) and value == noop
    if isinstance(noop, float):
        return isinstance(value, int | float) and value == noop
    if isinstance(noop, int):
        return type(value) is int and value == noop
    if isinstance(noop, dict):
        return (isinstance(value, dict) and value.keys() == noop.keys()
                and all(_same(value[k], noop[k]) for k in noop))
    if isinstance(noop, list):
        return (isinstance(value, list) and len(value) == len(noop)
                and all(_same(a, b) for a, b in zip(value, noop, strict=True)))
    return type(value) is type(noop) and value == noop


def _responses_supported(body: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``supported`` for a Responses body: the table above, the input items and their
    parts, ``text`` and ``stream_options``."""
    required = {k for k, f in ResponsesBody.model_fields.items() if f.is_required()}
    out = _judged(body, PARAMETERS[RESPONSES], prefix, RESPONSES, keep_null=required)
    if isinstance(out.get("input"), list):
        out["input"] = [_input_item(x, f"{prefix}input.{i}")
                        for i, x in enumerate(out["input"])]
    if isinstance(out.get("text"), dict):
        out["text"] = _judged(out["text"], TEXT_CONFIG, f"{prefix}text.", "text")
    if isinstance(out.get("stream_options"), dict):
        out["stream_options"] = _judged(out["stream_options"], RESPONSE_STREAM_OPTIONS,
                                        f"{prefix}stream_options.", "stream_options")
    if isinstance(out.get("tools"), list):
        out["tools"] = [_responses_tool(t, f"{prefix}tools.{i}")
                        for i, t in enumerate(out["tools"])]
    _function_choice(out.get("tool_choice"), prefix)
    return out


def _responses_tool(tool: Any, at: str) -> Any:
    return _function_tool(tool, at, RESPONSES_TOOL_FIELDS, keep_null={"type", "name"})


def _input_item(item: Any, at: str) -> Any:
    """One input item judged by INPUT_ITEM_FIELDS (its role's) and INPUT_PART_FIELDS."""
    if not isinstance(item, dict):
        return item
    kind = item.get("type", "message")
    if isinstance(kind, str) and kind in ITEM_TYPE_FIELDS:
        out = _judged(item, ITEM_TYPE_FIELDS[kind], f"{at}.", f"a {kind} item",
                      keep_null={"type", "call_id"})
        if isinstance(out.get("output"), list):
            out["output"] = [_input_part(p, f"{at}.output.{j}")
                             for j, p in enumerate(out["output"])]
        return out
    if isinstance(kind, str) and kind != "message":
        raise InvalidRequest(f"{at}.type: unsupported parameter: input items of type "
                             f"{shown(kind, 64)} are not supported: inferq takes message, "
                             "function_call and function_call_output items (reasoning, item "
                             "references and other tools' calls are not implemented)",
                             param=f"{at}.type", code=UNSUPPORTED)
    return _by_role(item, at, ITEM_ROLE_FIELDS, INPUT_ITEM_FIELDS, "message item", _input_part)


def _input_part(part: Any, at: str) -> Any:
    """A Responses input item's content part (PART_TYPE_FIELDS of INPUT_PART_FIELDS)."""
    return _text_part(part, at, INPUT_PARTS, keep_null={"text", "type"})


INPUT_PARTS = {kind: {k: INPUT_PART_FIELDS[k] for k in fields}
               for kind, fields in PART_TYPE_FIELDS.items()}
