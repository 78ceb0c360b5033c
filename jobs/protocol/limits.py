"""The bounds a generation request keeps, checked where it is parsed before anything
heavy runs: its tools (``check_tool_count``, on the raw body, before any tool is read),
its prompt's bytes (``check_prompt``, before anything is queued or tokenized) and its
JSON schemas' depth and size (``check_schemas``), and only then the schemas compiled
(jobs.protocol.structured, off the API's event loop).

- at most ``MAX_TOOLS`` tools, OpenAI's cap;
- each JSON schema (``response_format``'s, ``text.format``'s, each function's
  ``parameters``) at most ``MAX_SCHEMA_DEPTH`` levels deep, and a request's schemas
  together at most ``MAX_SCHEMA_BYTES`` bytes as JSON;
- a prompt's text (``messages``, ``prompt``, ``input`` and ``instructions``: UTF-8
  bytes) at most its model's ``max_prompt_bytes`` (jobs.fleet.catalog: the model's
  context length times ``prompt_bytes_per_token``, at most ``max_prompt_bytes``): 400
  ``context_length_exceeded``, as a prompt over the context is where it is tokenized.
"""

from __future__ import annotations

import weakref
from typing import Any

import orjson

from jobs.core.errors import InvalidRequest, shown
from jobs.protocol.endpoints import CHAT, COMPLETIONS, ModelInfo
from jobs.protocol.generation import ChatBody, CompletionBody
from jobs.protocol.responses_request import ResponsesBody
from jobs.protocol.structured import compile_error, grammar_problem, off_loop
from jobs.protocol.tool_use import Function, Tools
from jobs.protocol.tools import FunctionDefinition, FunctionTool, NamedToolChoice

MAX_TOOLS = 128
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_BYTES = 128 * 1024
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
PROMPT_FIELDS = ("messages", "prompt", "input", "instructions")


def check_tool_count(body: Any) -> None:
    """At most MAX_TOOLS tools (InvalidRequest naming ``tools``): checked first, on the
    body as sent."""
    tools = body.get("tools") if isinstance(body, dict) else None
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"tools: at most {MAX_TOOLS} tools per request, got "
                             f"{len(tools)}", param="tools", code="array_above_max_length")


def prompt_bytes(body: dict[str, Any]) -> int:
    """The UTF-8 bytes of a body's prompt text: every string in its ``messages``,
    ``prompt``, ``input`` and ``instructions``."""
    total, stack = 0, [body.get(k) for k in PROMPT_FIELDS]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) if v.isascii() else len(v.encode(errors="replace"))
        elif isinstance(v, bytes | bytearray):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return total


def prompt_param(endpoint: str) -> str:
    return "messages" if endpoint == CHAT else "prompt" if endpoint == COMPLETIONS else "input"


def check_prompt(endpoint: str, body: dict[str, Any], info: ModelInfo) -> None:
    """A prompt longer than its model takes is refused before anything is queued."""
    if info.max_prompt_bytes is not None:
        refuse_long_prompt(endpoint, body, info.name, info.max_prompt_bytes)


def refuse_long_prompt(endpoint: str, body: dict[str, Any], model: str, limit: int) -> None:
    """InvalidRequest (``context_length_exceeded``) when the prompt's text is more than
    ``limit`` bytes."""
    n = prompt_bytes(body)
    if n > limit:
        param = prompt_param(endpoint)
        raise InvalidRequest(f"{param}: the prompt is {n} bytes; the model {shown(model)} "
                             f"takes at most {limit} bytes of prompt (its context length "
                             "bounds it)", param=param, code=CONTEXT_LENGTH_EXCEEDED)


_longest: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token(model: Any) -> int:
    """The most UTF-8 bytes any token of ``model.tokenizer``'s vocabulary is written
    with (at least its text's bytes): a prompt of more than that many bytes per token of
    the context cannot fit, whatever it is."""
    got = _longest.get(model)
    if got is None:
        got = max((len(t.encode()) for t in model.tokenizer.get_vocab()), default=1)
        _longest[model] = got
    return got


def check_schemas(req: ChatBody | CompletionBody | ResponsesBody) -> None:
    """The request's JSON schemas: each at most MAX_SCHEMA_DEPTH deep, together at most
    MAX_SCHEMA_BYTES, then each one enforceable (and a required call's grammar), compiled
    off the event loop; InvalidRequest naming the schema's parameter."""
    found = schemas(req)
    total = 0
    for param, schema in found:
        if _too_deep(schema):
            raise InvalidRequest(f"{param}: the schema nests deeper than {MAX_SCHEMA_DEPTH} "
                                 "levels", param=param)
        total += len(orjson.dumps(schema))
        if total > MAX_SCHEMA_BYTES:
            raise InvalidRequest(f"{param}: a request's JSON schemas are at most "
                                 f"{MAX_SCHEMA_BYTES} bytes together", param=param)
    if not found and not _forces_call(req):
        return
    problem = off_loop(lambda: _first_problem(found, _forced(req)))
    if problem is not None:
        param, why = problem
        raise InvalidRequest(f"{param}: the schema cannot be enforced: {why}",
                             param=param)


def schemas(req: ChatBody | CompletionBody | ResponsesBody) -> list[tuple[str, dict[str, Any]]]:
    """Each JSON schema of a request, by where it is."""
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(req, CompletionBody):
        return out
    fmt = req.constraint()
    if fmt is not None and fmt.type == "json_schema":
        where = "response_format" if isinstance(req, ChatBody) else "text.format"
        out.append((where, fmt.answer_schema() or {}))
    tools: list[Any] = list(req.tools or [])
    for i, t in enumerate(tools):
        fn: FunctionDefinition = t.function if isinstance(t, FunctionTool) else t
        if fn.parameters is not None:
            at = f"tools.{i}.function" if isinstance(t, FunctionTool) else f"tools.{i}"
            out.append((f"{at}.parameters", fn.parameters))
    return out


def _forces_call(req: ChatBody | CompletionBody | ResponsesBody) -> bool:
    """``tool_choice`` is ``required`` or a function, with tools."""
    return not isinstance(req, CompletionBody) and bool(req.tools) and \
        req.tool_choice not in (None, "none", "auto")


def _forced(req: ChatBody | CompletionBody | ResponsesBody) -> str | None:
    """The grammar of a required call (``tool_choice`` ``required`` or a function)."""
    if isinstance(req, CompletionBody) or not req.tools or not _forces_call(req):
        return None
    choice = req.tool_choice
    assert choice is not None
    picked = (choice if isinstance(choice, str) else choice.function.name
              if isinstance(choice, NamedToolChoice) else choice.name)
    fns = tuple(Function(f.name, f.description, f.parameters) for f in
                (t.function if isinstance(t, FunctionTool) else t for t in req.tools))
    c = Tools(fns, picked, req.parallel_tool_calls is not False).constraint()
    return c.grammar() if c is not None else None


def _first_problem(found: list[tuple[str, dict[str, Any]]], forced: str | None
                   ) -> tuple[str, str] | None:
    """The first schema that cannot be enforced: the answer's (walked into, as a
    required call's grammar is), the functions' only compiled (nothing enforces them
    unless a call is required, when their grammar is that call's)."""
    for param, schema in found:
        if why := compile_error(schema, walk=not param.startswith("tools.")):
            return param, why
    if forced is not None and (why := grammar_problem(forced)):
        return "tools", f"the grammar of a required call: {why}"
    return None


def _too_deep(schema: Any) -> bool:
    level = [schema]
    for _ in range(MAX_SCHEMA_DEPTH):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v)
                 if isinstance(c, dict | list)]
        if not level:
            return False
    return True
