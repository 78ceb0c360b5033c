"""Structured outputs: ``response_format`` (chat) as the grammar every engine enforces.

``{"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}``
constrains the answer to JSON valid for ``schema``; ``{"type": "json_object"}`` to one JSON
object; ``{"type": "text"}`` is the default (no constraint). Both engines enforce it with
llguidance, by masking the tokens that cannot continue a valid answer at each step: the
transformers engine through its own matcher per sequence (``workers.engines.generation``), vLLM
through its guidance backend. The same library checks a schema here, where the request
is parsed (the API, batch validation; llguidance needs no torch): a schema it cannot
compile is a 400 that says why, before anything runs. An answer cut by ``max_tokens``
ends with ``finish_reason: "length"`` and may be incomplete JSON, as at OpenAI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

STRICT = ConfigDict(extra="forbid", strict=True)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # JSON mode: any object


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
            problem = compile_error(self.answer_schema() or {})
            if problem:
                raise ValueError(f"json_schema.schema: the schema cannot be enforced: "
                                 f"{problem}")
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
        self.response_format()  # the same checks as chat's
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


def constraint(fmt: ResponseFormat | None) -> Constraint | None:
    schema = fmt.answer_schema() if fmt is not None else None
    if schema is None:
        return None
    assert fmt is not None
    return Constraint(schema, fmt.type == "json_object")


def compile_error(schema: dict[str, Any]) -> str:
    """Why llguidance cannot enforce ``schema`` ("" when it can)."""
    import llguidance

    try:
        grammar = llguidance.grammar_from("json_schema", orjson.dumps(schema).decode())
        return str(llguidance.LLMatcher.validate_grammar(grammar))
    except (ValueError, TypeError, RuntimeError, orjson.JSONEncodeError) as e:
        return str(e) or type(e).__name__
