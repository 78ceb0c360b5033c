"""Typed request bodies shared by the API (synchronous calls) and batch validation.

One definition per endpoint, so a batch line and a direct call are judged alike.
Every body is validated strictly, as OpenAI does: a JSON string is never a number or a
boolean, a boolean never a number, a number written with a decimal point or an
exponent never an integer, while an integer is a number (``temperature: 1`` is 1.0).
Text that may come from a binary Parquet cell (``Text``) also takes bytes, read as
UTF-8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator
from pydantic_core import ErrorDetails

from jobs.errors import InvalidRequest, shown

if TYPE_CHECKING:
    from jobs.catalog import Catalog

EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ENDPOINTS = (EMBEDDINGS, CHAT, COMPLETIONS)

# Which models exist and what they serve: the registry (jobs.catalog). A model's output
# size is known where it is loaded: the worker refuses ``dimensions`` above it.
# Bounds a request's numbers and names must keep (an int64 column, an int32 tensor).
INT64 = 2**63
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
Name = Annotated[str, Field(max_length=256)]
# A request's text where a Parquet dataset may hold it as binary (input, prompt, a
# message's content and name): bytes are read as UTF-8; a number or a boolean is refused.
Text = Annotated[str, Strict(False)]
OPEN_BODY = ConfigDict(strict=True, extra="allow")  # strict types; unknown parameters kept


class EmbeddingsBody(BaseModel):
    model_config = OPEN_BODY

    model: Name
    input: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, lt=INT64)
    user: Name | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, str):
            if not v:
                raise ValueError("input must be a non-empty string")
        elif not v:
            raise ValueError("input must not be an empty list")
        elif isinstance(v[0], str) and any(not s for s in v):
            raise ValueError("input must not contain empty strings")
        elif isinstance(v[0], list) and any(not t for t in v):
            raise ValueError("token arrays must not be empty")
        return v

    def inputs(self) -> list[str] | list[list[int]]:
        """Normalised to a list of texts or a list of token-id lists."""
        v = self.input
        if isinstance(v, str):
            return [v]
        if isinstance(v[0], int):
            return [cast(list[int], v)]
        return cast(list[str] | list[list[int]], list(v))


def parse_embeddings(body: Any, max_inputs: int,
                     models: Catalog | None = None) -> EmbeddingsBody:
    """Validate an embeddings body; raises InvalidRequest naming the offending param.

    ``models``: the registry snapshot the model is checked against; None where the
    body was already checked at the door (a worker re-reading it). Inputs longer
    than the model's context are refused by the worker, which holds the tokenizer.
    """
    req: EmbeddingsBody = parse_model(EmbeddingsBody, body)
    if models is not None:
        models.require(req.model, EMBEDDINGS)
    if len(req.inputs()) > max_inputs:
        raise InvalidRequest(f"input: at most {max_inputs} inputs per request", param="input")
    return req


def text_length(body: dict[str, Any]) -> int:
    """A cheap size estimate used to sort rows inside a shard (no tokenizer here)."""
    if isinstance(body.get("messages"), list):
        return sum(len(str(m.get("content", ""))) for m in body["messages"]
                   if isinstance(m, dict))
    v = body.get("input", body.get("prompt"))
    if isinstance(v, str):
        return len(v)
    if isinstance(v, list):
        return sum(len(x) if isinstance(x, str | list) else 1 for x in v)
    return 0


class BatchCreate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    input_file_id: Name
    endpoint: Name
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    service_tier: Literal["default", "flex", "auto"] = "default"
    # inferq extension: request defaults for Parquet inputs (e.g. {"model": ...}).
    body: dict[str, Any] = Field(default_factory=dict)
    # inferq extension: where the batch's terminal event is also sent (jobs/webhooks.py).
    callback_url: str | None = Field(default=None, max_length=2048)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > 16:
            raise ValueError("metadata: at most 16 key-value pairs")
        for k, val in v.items():
            if len(k) > 64:
                raise ValueError("metadata keys are at most 64 characters")
            if len(val) > 512:
                raise ValueError("metadata values are at most 512 characters")
        return v


def parse_model(cls: type[BaseModel], body: Any) -> Any:
    """``body`` validated by ``cls``; InvalidRequest naming the offending param."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        located = [(err, _path(err, body)) for err in e.errors()]
        err, path = _reported(located)
        param = ".".join(str(p) for p in path) or None
        expected = list(dict.fromkeys(EXPECTED[x["type"]] for x, p in located
                                      if p == path and x["type"] in EXPECTED))
        if err["type"] in EXPECTED:
            either = ", ".join(expected[:-1]) + " or " if len(expected) > 1 else ""
            msg = f"expected {either}{expected[-1]}, got {_json_value(err['input'])}"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
        if param and not msg.startswith((f"{param} ", f"{param}:")):
            msg = f"{param}: {msg}"
        raise InvalidRequest(msg, param=param) from e


# What a value of the wrong JSON type should have been, by pydantic's error type.
EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean",
            "string_type": "a string", "list_type": "an array", "dict_type": "an object",
            "model_type": "an object"}


def _json_value(v: Any) -> str:
    """A client's value as JSON names it: ``a boolean (true)``, ``a string ('0.5')``."""
    if v is None:
        return "null"
    if isinstance(v, bool | int | float):
        kind = ("a boolean" if isinstance(v, bool) else "an integer" if isinstance(v, int)
                else "a number")
        return f"{kind} ({shown(orjson.dumps(v).decode())[1:-1]})"
    if isinstance(v, str):
        return f"a string ({shown(v)})"
    if isinstance(v, bytes | bytearray):
        return "binary data"
    return "an array" if isinstance(v, list) else "an object"


def _path(err: ErrorDetails, body: Any) -> list[int | str]:
    """Where in ``body`` the error is: its location less the names pydantic gives the
    members of a union (``input.list[str].0`` is ``input.0``)."""
    path: list[int | str] = []
    at: Any = body
    loc = err["loc"]
    for i, part in enumerate(loc):
        if isinstance(at, dict) and part in at:
            at = at[part]
        elif isinstance(at, list) and isinstance(part, int) and 0 <= part < len(at):
            at = at[part]
        elif not (isinstance(at, dict) and i == len(loc) - 1 and err["type"] == "missing"):
            continue  # a union member's name, not a place in the body
        path.append(part)
    return path


def _reported(located: list[tuple[ErrorDetails, list[int | str]]]
              ) -> tuple[ErrorDetails, list[int | str]]:
    """The error to report: the first field's and, of that field's errors (one per
    member of a union), the one deepest in the body: ``[[true]]`` for a list of
    token-id lists is wrong at ``input.0.0``, not for being no string."""
    first = located[0][1][:1]
    same = [x for x in located if x[1][:1] == first]
    return max(same, key=lambda x: len(x[1]))  # max keeps the first of the deepest


# Text generation ---------------------------------------------------------------------------

MAX_STOP = 4


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class Message(BaseModel):
    model_config = OPEN_BODY

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[dict[str, Any]] | None = None
    name: Annotated[Text, Field(max_length=256)] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        if isinstance(v, list):
            if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in v):
                raise ValueError("only text content parts are supported")
            return "".join(p["text"] for p in v)
        return v


class Sampling(BaseModel):
    """Parameters shared by chat completions and completions."""

    model_config = OPEN_BODY

    model: Name
    max_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    max_completion_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Name | None = None

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP} non-empty strings")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatBody(Sampling):
    messages: list[Message] = Field(min_length=1)


class CompletionBody(Sampling):
    prompt: Text | list[Text]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request is supported")
            v = v[0]
        if not v:
            raise ValueError("prompt must be a non-empty string")
        return v


def parse_generation(endpoint: str, body: Any,
                     models: Catalog | None = None) -> ChatBody | CompletionBody:
    """Validate a chat or completions body (everything that needs no tokenizer).

    ``models``: as for parse_embeddings; the prompt's length is checked by the worker.
    """
    req: ChatBody | CompletionBody = parse_model(ChatBody if endpoint == CHAT else
                                                 CompletionBody, body)
    if models is not None:
        models.require(req.model, endpoint)
    return req
