"""Structured outputs: ``response_format`` (chat) as the grammar every engine enforces.

``{"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}``
constrains the answer to JSON valid for ``schema``; ``{"type": "json_object"}`` to one JSON
object; ``{"type": "text"}`` is the default (no constraint). Both engines enforce it with
llguidance, by masking the tokens that cannot continue a valid answer at each step: the
transformers engine through its own matcher per sequence (``workers.engines.generation``), vLLM
through its guidance backend. The same library checks a schema here, where the request
is parsed (the API, batch validation; llguidance needs no torch): a schema it cannot
compile is a 400 that says why, before anything runs (``grammar_problem``: it does not
compile, it admits no answer, e.g. ``{"$ref": "#"}``, or its first bytes already exceed
llguidance's limits, e.g. an ``anyOf`` wider than a parser row takes). The checks run
after the request's cheap bounds (``jobs.protocol.limits``), and off the API's event
loop (llguidance releases the GIL while it compiles). An answer cut by ``max_tokens``
ends with ``finish_reason: "length"`` and may be incomplete JSON, as at OpenAI; an
answer the grammar failed on midway (``Constraint.broken``) is an error, never a
``"stop"``.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

STRICT = ConfigDict(extra="forbid", strict=True)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # JSON mode: any object
T = TypeVar("T")


class JsonSchema(BaseModel):
    # (bodies are dumped and sent on to the workers: under the name clients use)
    model_config = ConfigDict(extra="forbid", strict=True, serialize_by_alias=True)

    name: str
    description: str | None = None
    # "schema" shadows a BaseModel attribute in pydantic: kept under another name
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.fullmatch(v):
            raise ValueError("name: letters, digits, '_' and '-', at most 64 characters")
        return v


class ResponseFormat(BaseModel):
    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _enforceable(self) -> ResponseFormat:
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("json_schema: required when type is 'json_schema'")
        elif self.json_schema is not None:
            raise ValueError(f"json_schema: only with type 'json_schema', not {self.type!r}")
        return self

    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer must satisfy (None: plain text)."""
        if self.type == "json_object":
            return ANY_OBJECT
        if self.type == "json_schema":
            assert self.json_schema is not None
            return self.json_schema.schema_ or {}
        return None


class TextFormat(BaseModel):
    """The Responses API's ``text.format``: chat's ``response_format`` flattened
    (``{"type": "json_schema", "name", "schema", "strict"?, "description"?}``)."""

    model_config = ConfigDict(extra="forbid", strict=True, serialize_by_alias=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _as_chat(self) -> TextFormat:
        if self.type == "json_schema":
            if self.name is None or self.schema_ is None:
                raise ValueError("format: name and schema are required when type is "
                                 "'json_schema'")
        elif any(v is not None for v in (self.name, self.schema_, self.strict,
                                         self.description)):
            raise ValueError(f"format: name, schema, strict and description are for type "
                             f"'json_schema', not {self.type!r}")
        self.response_format()  # the same checks as chat's (the schema's: enforceable)
        return self

    def response_format(self) -> ResponseFormat:
        if self.type != "json_schema":
            return ResponseFormat(type=self.type)
        return ResponseFormat.model_validate({"type": "json_schema", "json_schema": {
            k: v for k, v in (("name", self.name), ("schema", self.schema_),
                              ("strict", self.strict), ("description", self.description))
            if v is not None}})


@dataclass(frozen=True)
class Constraint:
    """What a generation request's answer must be, as the engines take it."""

    schema: dict[str, Any]
    json_object: bool = False  # any JSON object (JSON mode)
    # A Lark grammar (llguidance's, JSON schemas inside as ``%json``) in place of the
    # schema: tool calls (jobs.protocol.tool_use)
    lark: str | None = None

    def grammar(self) -> str:
        """llguidance's grammar for it."""
        import llguidance

        if self.lark is not None:
            return str(llguidance.grammar_from("lark", self.lark))
        return str(llguidance.grammar_from("json_schema", orjson.dumps(self.schema).decode()))

    def broken(self, answer: str) -> str:
        """Why ``answer``, ended as complete, is not a whole answer of the grammar ("" when
        it is): an engine whose grammar failed midway may end the answer early."""
        import llguidance

        m = llguidance.LLMatcher(_bytes(), self.grammar(), log_level=0, limits=_limits())
        if not m.consume_tokens(list(answer.encode())):
            return f"the answer left its grammar: {_first_line(m.get_error())}"
        return "" if m.is_accepting() else "the answer ended before its grammar was complete"


def constraint(fmt: ResponseFormat | None) -> Constraint | None:
    schema = fmt.answer_schema() if fmt is not None else None
    if schema is None:
        return None
    assert fmt is not None
    return Constraint(schema, fmt.type == "json_object")


def compile_error(schema: dict[str, Any], walk: bool = True) -> str:
    """Why llguidance cannot enforce ``schema`` ("" when it can): ``grammar_problem``,
    or with ``walk`` false only whether it compiles."""
    import llguidance

    try:
        grammar = llguidance.grammar_from("json_schema", orjson.dumps(schema).decode())
    except (ValueError, TypeError, RuntimeError, orjson.JSONEncodeError) as e:
        return str(e) or type(e).__name__
    return grammar_problem(grammar, walk)


PROBE_BYTES = 16  # bytes of an answer walked at request time (see grammar_problem)
EOS = 256  # the end token of the byte tokenizer below
_WHITESPACE = b" \t\n\r"


def grammar_problem(grammar: str, walk: bool = True) -> str:
    """Why llguidance cannot enforce ``grammar`` ("" when it can): it does not compile;
    no answer can start (a schema that is only a reference to itself); or it fails in
    the first ``PROBE_BYTES`` of an answer, walked byte by byte (a row too wide for
    llguidance's parser, as an ``anyOf`` of thousands). Deeper failures end the answer
    with an error where it is generated."""
    import llguidance

    try:
        problem = str(llguidance.LLMatcher.validate_grammar(grammar, limits=_limits()))
    except (ValueError, TypeError, RuntimeError) as e:
        return str(e) or type(e).__name__
    if problem or not walk:
        return problem
    m = llguidance.LLMatcher(_bytes(), grammar, log_level=0, limits=_limits())
    for step in range(PROBE_BYTES):
        allowed = int.from_bytes(m.compute_bitmask(), "little")
        if m.is_error() or not allowed:
            if step == 0 and "NoExtension" in m.get_error():
                return ("no answer satisfies it (a schema that refers only to itself, or "
                        "references in a loop, has no finite value)")
            return _first_line(m.get_error()) or "it admits no answer"
        picked = _next_byte(allowed)
        if picked is None:
            return ""  # complete already (nothing but the end may follow)
        m.consume_token(picked)
    return ""


def _next_byte(allowed: int) -> int | None:
    """The byte the probe takes next: the lowest allowed one that is no whitespace (a
    walk into the answer's structure), else whitespace; None: only the end."""
    for b in (*range(0x21, 0x100), *_WHITESPACE):
        if allowed >> b & 1:
            return b
    return None


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0] if error.strip() else ""


_lock = threading.Lock()
_tokenizer: Any = None


def _bytes() -> Any:
    """An llguidance tokenizer whose tokens are the 256 bytes (and an end token): to
    walk and check answers without a model's tokenizer."""
    global _tokenizer
    with _lock:
        if _tokenizer is None:
            import llguidance

            _tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokens()),
                                                slices=[])
        return _tokenizer


class _ByteTokens:
    eos_token_id = EOS
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"</s>"]
    special_token_ids = [EOS]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def _limits() -> Any:
    """llguidance's default limits, with short errors (no parser state in a message)."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def off_loop(fn: Callable[[], T]) -> T:
    """``fn()``, in gevent's thread pool where gevent patched this process (the API's
    event loop serves other clients meanwhile: llguidance releases the GIL while it
    compiles), else here."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        import gevent

        return gevent.get_hub().threadpool.apply(fn)
    return fn()
