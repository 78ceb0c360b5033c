"""Function tools in a request: chat's ``tools`` and ``tool_choice`` and the Responses
API's flat ones, an earlier answer's calls (``ToolCallIn``), the check of a choice
against the tools, and whether a model serves tools.

A model serves tools when its chat template renders them (refers to ``tools``:
``renders_tools``). No torch here: the API, batch validation and the workers share it.
The tools as a request uses them are ``jobs.protocol.tool_use``; the calls read back
from an answer, ``jobs.protocol.tool_calls``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobs.core.errors import InvalidRequest, shown

STRICT = ConfigDict(extra="forbid", strict=True)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TEMPLATE_TOOLS = re.compile(r"\btools\b")


def renders_tools(template: str | None) -> bool:
    """A chat template renders tools when it refers to them (``tools``)."""
    return bool(template) and bool(TEMPLATE_TOOLS.search(template or ""))


def chat_template(folder: Path) -> str | None:
    """A model folder's chat template as transformers finds it: ``chat_template.jinja``,
    ``chat_template.json``'s, else ``tokenizer_config.json``'s (named templates: the
    default one, or all of them)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(errors="replace")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            got = json.loads((folder / name).read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(got, list):
            got = "\n".join(str(t.get("template", "")) for t in got if isinstance(t, dict))
        if isinstance(got, str) and got:
            return got
    return None


def no_tools(model: str) -> InvalidRequest:
    """A request with tools (or tool messages) for a model that cannot take them."""
    return InvalidRequest(f"tools: unsupported parameter: the model {shown(model)} does not "
                          "support tools: its chat template does not render tools",
                          param="tools", code="unsupported_parameter")


def _checked_name(v: str) -> str:
    if not NAME.fullmatch(v):
        raise ValueError("name: letters, digits, '_' and '-', at most 64 characters")
    return v


class FunctionDefinition(BaseModel):
    """A function's definition: chat's ``function`` of a tool, and the fields of the
    Responses API's flat function tool."""

    model_config = STRICT

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _fn_name(cls, v: str) -> str:
        return _checked_name(v)


class FunctionTool(BaseModel):
    """One of chat's ``tools``: ``{"type": "function", "function": {...}}``."""

    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    """Chat's ``tool_choice`` naming a function."""

    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ResponsesFunctionTool(FunctionDefinition):
    """One of the Responses API's ``tools``: a function tool, flat."""

    type: Literal["function"]

    def chat(self) -> dict[str, Any]:
        """As one of chat's ``tools``."""
        fn = self.model_dump(exclude_none=True, exclude={"type"})
        return {"type": "function", "function": fn}

    def echoed(self) -> dict[str, Any]:
        """As the Response object states it (every field of the SDK's FunctionTool)."""
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters, "strict": self.strict}


class ResponsesNamedChoice(NamedFunction):
    """The Responses API's ``tool_choice`` naming a function: flat, its ``name`` beside
    ``type``."""

    type: Literal["function"]


ResponsesToolChoice = Literal["none", "auto", "required"] | ResponsesNamedChoice


class CalledFunction(BaseModel):
    model_config = STRICT

    name: str
    arguments: str


class ToolCallIn(BaseModel):
    """An earlier answer's call, in an assistant message's ``tool_calls``."""

    model_config = STRICT

    id: str = Field(max_length=256)
    type: Literal["function"]
    function: CalledFunction

    def template(self) -> dict[str, Any]:
        """As chat templates take it: the arguments as an object where they parse."""
        try:
            args: Any = orjson.loads(self.function.arguments)
        except orjson.JSONDecodeError:
            args = self.function.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": args}}


def check_choice(tools: list[FunctionTool] | list[ResponsesFunctionTool] | None,
                 choice: Any) -> None:
    """``tool_choice`` against the request's tools: ``required`` and a named function
    need tools, a named function one of them (ValueError)."""
    names = [t.function.name if isinstance(t, FunctionTool) else t.name for t in tools or []]
    named = (choice.function.name if isinstance(choice, NamedToolChoice) else
             choice.name if isinstance(choice, ResponsesNamedChoice) else None)
    if choice == "required" and not names:
        raise ValueError("tool_choice: 'required' needs tools")
    if named is not None and named not in names:
        raise ValueError(f"tool_choice: names the function {named!r}, which is not one of "
                         f"the tools ({', '.join(names) or 'none given'})")
