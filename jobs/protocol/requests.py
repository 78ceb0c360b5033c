"""Typed request bodies shared by the API (synchronous calls) and batch validation.

One definition per endpoint, so a batch line and a direct call are judged alike.
Every body is validated strictly, as OpenAI does: a JSON string is never a number or a
boolean, a boolean never a number, a number written with a decimal point or an
exponent never an integer, while an integer is a number (``temperature: 1`` is 1.0).
Text that may come from a binary Parquet cell (``Text``) also takes bytes, read as
UTF-8.

What each request parameter does is one table, ``PARAMETERS`` (by endpoint: every
parameter of the pinned openai SDK's create method), with ``MESSAGE_FIELDS``,
``TEXT_PART_FIELDS`` and ``STREAM_OPTIONS`` for the objects inside a body: a parameter
is implemented (a field of the endpoint's model below), taken only at the value that
does nothing (``DEFAULT_ONLY``: left out of the body the model reads), or refused.
``supported`` judges a body by it before the model reads it: anything it does not
implement and sent at another value is 400 ``unsupported_parameter`` naming it, and a
name the table does not know is 400 ``unknown_parameter``; ``null`` is the same as
leaving an optional parameter out. docs/API.md's table is ``parameter_table()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, cast

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from jobs.core.errors import InvalidRequest, shown
from jobs.protocol.structured import ResponseFormat, TextFormat
from jobs.protocol.tools import (
    FunctionTool,
    ResponsesFunctionTool,
    ResponsesToolChoice,
    ToolCallIn,
    ToolChoice,
    check_choice,
    no_tools,
)

EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"  # run as a chat request (see Responses below)
ENDPOINTS = (EMBEDDINGS, CHAT, COMPLETIONS, RESPONSES)


@dataclass(frozen=True)
class ModelInfo:
    """One servable model: its public name, its kind (embeddings | chat), whether its
    chat template renders tools (None: not known; the worker that renders it decides)
    and whether it serves shortened vectors (``dimensions``)."""

    name: str
    kind: str
    tools: bool | None = None
    matryoshka: bool = False


class ServedModels(Protocol):
    """What parsing asks of the models served (``jobs.fleet.catalog.Catalog``)."""

    def require(self, name: str, endpoint: str, param: str = "model") -> ModelInfo: ...

# Which models exist and what they serve: the registry (jobs.fleet.catalog). A model's output
# size is known where it is loaded: the worker refuses ``dimensions`` above it.
# Bounds a request's numbers and names must keep (an int64 column, an int32 tensor).
INT64 = 2**63
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
Name = Annotated[str, Field(max_length=256)]
# A request's text where a Parquet dataset may hold it as binary (input, prompt, a
# message's content and name): bytes are read as UTF-8; a number or a boolean is refused.
Text = Annotated[str, Strict(False)]
# Strict types; a field the table does not implement never reaches a model (``supported``
# refuses it or leaves it out), so one that did would be a 400 all the same.
BODY = ConfigDict(strict=True, extra="forbid")


class EmbeddingsBody(BaseModel):
    model_config = BODY

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


def no_dimensions(model: str, param: str = "dimensions") -> InvalidRequest:
    """``dimensions`` for a model not trained for shortened vectors (OpenAI's answer for
    such a model too: a 400)."""
    return InvalidRequest(f"{param}: unsupported parameter: the model {shown(model)} was "
                          "not trained for shortened vectors (its registry entry is not "
                          "matryoshka); leave dimensions out for its full vectors",
                          param=param, code="unsupported_parameter")


def parse_embeddings(body: Any, max_inputs: int,
                     models: ServedModels | None = None) -> EmbeddingsBody:
    """Validate an embeddings body; raises InvalidRequest naming the offending param.

    ``models``: the registry snapshot the model is checked against; None where the
    body was already checked at the door (a worker re-reading it). Inputs longer
    than the model's context are refused by the worker, which holds the tokenizer.
    """
    req: EmbeddingsBody = parse_model(EmbeddingsBody, supported(EMBEDDINGS, body))
    if models is not None:
        info = models.require(req.model, EMBEDDINGS)
        if req.dimensions is not None and not info.matryoshka:
            raise no_dimensions(req.model)
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


MIN_FILE_EXPIRY_S, MAX_FILE_EXPIRY_S = 3600, 30 * 86400  # as OpenAI's files


class ExpiresAfter(BaseModel):
    """When a File expires: ``seconds`` after its ``created_at`` (files, uploads, and
    a batch's output and error files)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_FILE_EXPIRY_S, le=MAX_FILE_EXPIRY_S)


URI = Annotated[str, Field(strict=True, min_length=1, max_length=512)]
Column = Annotated[str, Field(strict=True, min_length=1, max_length=256)]


class DatasetInput(BaseModel):
    """inferq extension: a batch over a dataset where it is (jobs/batches/datasets.py):
    the objects ``uri`` names (one object, a prefix, a glob), Parquet or JSONL rows.
    Each row is one request: ``id_column`` its custom_id, and its input the
    ``input_column`` or the ``template`` over columns (``"{title}: {body}"``);
    ``system``, a system prompt (chat and responses)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    uri: URI
    format: Literal["parquet", "jsonl"] | None = None
    id_column: Column = "custom_id"
    input_column: Column | None = None
    template: Annotated[str, Field(strict=True, min_length=1, max_length=65536)] | None = None
    system: Annotated[str, Field(strict=True, max_length=65536)] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> DatasetInput:
        if self.template is not None and self.input_column is not None:
            raise ValueError("give input_column or template, not both")
        return self


class DatasetOutput(BaseModel):
    """inferq extension: where a batch also writes its results as a Parquet dataset
    (one part per shard, a manifest, then ``_SUCCESS``)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    uri: URI


class BatchCreate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    # One of the two: an uploaded file, or (inferq extension) a dataset in place.
    input_file_id: Name | None = None
    input_dataset: DatasetInput | None = None
    output_dataset: DatasetOutput | None = None
    endpoint: Name
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    service_tier: Literal["default", "flex", "auto"] = "default"
    # inferq extension: request defaults, under each request's own fields (JSONL) or
    # beside a dataset's input column (Parquet), e.g. {"model": ...}.
    body: dict[str, Any] = Field(default_factory=dict)
    # inferq extension: where the batch's terminal event is also sent (jobs/webhooks/events.py).
    callback_url: str | None = Field(default=None, max_length=2048)
    # Its output and error files expire this long after they are made.
    output_expires_after: ExpiresAfter | None = None

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

    @model_validator(mode="after")
    def _defaults(self) -> BatchCreate:
        """Defaults a request could not take are refused with the batch, not once per
        line: parameters the endpoint does not implement, or does not know."""
        supported(self.endpoint, self.body, prefix="body.")
        if (self.input_file_id is None) == (self.input_dataset is None):
            raise ValueError("give input_file_id (an uploaded file) or input_dataset (a "
                             "dataset in the object store), one of the two")
        if self.output_dataset is not None and self.input_dataset is None:
            raise ValueError("output_dataset is for a batch over an input_dataset")
        return self


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
# OpenAI's bounds: logit_bias entries and their values, choices, log probabilities.
MAX_LOGIT_BIAS, MAX_BIAS = 300, 100
MAX_N, MAX_BEST_OF = 128, 20
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5
Penalty = Annotated[float, Field(ge=-2, le=2)]


class StreamOptions(BaseModel):
    model_config = BODY

    include_usage: bool = False


class Message(BaseModel):
    model_config = BODY

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[dict[str, Any]] | None = None
    name: Annotated[Text, Field(max_length=256)] | None = None
    # an assistant message's calls, and the call a tool message answers
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: Name | None = None

    @model_validator(mode="after")
    def _tool_message(self) -> Message:
        if self.role == "tool" and (self.tool_call_id is None or self.content is None):
            raise ValueError("a tool message needs content and tool_call_id (the id of the "
                             "call it answers)")
        return self

    def uses_tools(self) -> bool:
        return self.role == "tool" or bool(self.tool_calls)

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

    model_config = BODY

    model: Name
    max_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Name | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, float] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP} non-empty strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        """Token ids (decimal strings) to -100..100; which ids the model has is the
        worker's to check (``workers.engines.request``)."""
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias: at most {MAX_LOGIT_BIAS} tokens, got {len(v)}")
        for k, bias in v.items():
            if not (k.isascii() and k.isdigit() and len(k) <= 10 and int(k) < 2**31):
                raise ValueError(f"logit_bias: keys are token ids (integers as strings), got "
                                 f"{shown(k, 32)}")
            if not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(f"logit_bias: values are from -{MAX_BIAS} to {MAX_BIAS}, "
                                 f"got {bias:g} for token {k}")
        return v

    def token_bias(self) -> dict[int, float]:
        return {int(k): float(b) for k, b in (self.logit_bias or {}).items()}

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatBody(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _tool_choice(self) -> ChatBody:
        tools_checked(self.tools, self.tool_choice, self.response_format)
        return self

    def uses_tools(self) -> bool:
        """Tools or tool messages: the model's chat template must render them."""
        return bool(self.tools) or any(m.uses_tools() for m in self.messages)

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs: logprobs must be true when top_logprobs is set")
        return v

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def top_count(self) -> int | None:
        """Alternatives reported per token (None: no log probabilities)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionBody(Sampling):
    prompt: Text | list[Text]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_BEST_OF)

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if v is not None and isinstance(n, int) and v < n:
            raise ValueError(f"best_of: must be at least n ({n}), got {v}")
        if v is not None and v > 1 and info.data.get("stream"):
            raise ValueError("best_of: results cannot be streamed when best_of is above 1")
        return v

    def top_count(self) -> int | None:
        return self.logprobs

    def candidates(self) -> int:
        """Sequences generated: best_of (at least n)."""
        return self.best_of or self.n

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


def tools_checked(tools: list[FunctionTool] | list[ResponsesFunctionTool] | None,
                  choice: Any, fmt: ResponseFormat | None) -> None:
    """``tool_choice`` against the tools (and a structured output: one constraint at a
    time), each function named once; InvalidRequest naming the parameter."""
    try:
        check_choice(tools, choice)
    except ValueError as e:
        raise InvalidRequest(str(e), param="tool_choice") from None
    if choice not in (None, "none", "auto") and fmt is not None and fmt.type != "text":
        raise InvalidRequest("tool_choice: a required call and a structured output cannot "
                             "both constrain the answer", param="tool_choice")
    names = [t.function.name if isinstance(t, FunctionTool) else t.name for t in tools or []]
    if len(set(names)) < len(names):
        raise InvalidRequest("tools: two functions have the same name", param="tools")


def parse_generation(endpoint: str, body: Any,
                     models: ServedModels | None = None) -> ChatBody | CompletionBody:
    """Validate a chat or completions body (everything that needs no tokenizer).

    ``models``: as for parse_embeddings; the prompt's length is checked by the worker.
    """
    req: ChatBody | CompletionBody = parse_model(ChatBody if endpoint == CHAT else
                                                 CompletionBody, supported(endpoint, body))
    if models is not None:
        info = models.require(req.model, endpoint)
        if isinstance(req, ChatBody) and req.uses_tools() and info.tools is False:
            raise no_tools(req.model)
    return req


# Request parameters: what inferq does with each ------------------------------------------

IMPLEMENTED, DEFAULT_ONLY, REFUSED = "implemented", "default only", "refused"
UNSUPPORTED, UNKNOWN = "unsupported_parameter", "unknown_parameter"


@dataclass(frozen=True)
class Param:
    """What inferq does with one parameter. ``noop``: the values besides null a
    DEFAULT_ONLY parameter is taken at, each the answer without it (JSON-typed: ``0.0``
    is any number 0, ``1`` the integer 1, ``False`` the boolean)."""

    status: str
    note: str
    noop: tuple[Any, ...] = ()


def _impl(note: str) -> Param:
    return Param(IMPLEMENTED, note)


def _only(note: str, *noop: Any) -> Param:
    return Param(DEFAULT_ONLY, note, noop)


def _refused(note: str) -> Param:
    return Param(REFUSED, note)


PENALTIES = ("-2 to 2, OpenAI's formula: each token's logit less `presence_penalty` if the "
             "choice generated it so far and `frequency_penalty` times the times it did")
LOGIT_BIAS = ("up to 300 token ids of the model's tokenizer (strings) to -100..100, added to "
              "their logits before sampling; an id the model does not have is a 400")
N = ("1 to 128 choices, each its own sequence (`index`; with `seed`, choice i is seeded "
     "seed + i); usage counts every choice's tokens, the prompt once")
FUNCTIONS = "the deprecated functions are not implemented: use `tools` (see Tool calls)"
TOOLS_DOC = "see Tool calls"
TOOL_CHOICE = ("`none` (tools not given to the model, no calls), `auto` (the default with "
               "tools), `required`, or `{\"type\": \"function\", \"function\": {\"name\"}}`; "
               "`required` and a named function are enforced token by token (see Tool calls)")
PARALLEL = ("`true` (the default): one or more calls; `false`: at most one (see Tool calls)")
LOGPROBS = "log probabilities are not implemented"
PROMPT_CACHE = "no client-directed prompt cache (the workers' prefix cache needs no hints)"
USER = ("checked (at most 256 characters), else unused: it changes no answer (a job or a "
        "batch keeps it only as part of the request's stored body)")
MAX_TOKENS = "the completion's token limit, within the context; none: the rest of the context"
SHARED: dict[str, Param] = {
    "max_tokens": _impl(MAX_TOKENS),
    "seed": _impl("seeds this request's own sampler (a signed 64-bit integer); best effort, "
                  "as at OpenAI"),
    "stop": _impl(f"up to {MAX_STOP} non-empty strings; the text ends before the first"),
    "stream": _impl("server-sent events (see Chat completions / completions)"),
    "stream_options": _impl("see `stream_options` below"),
    "temperature": _impl("0 to 2; 0 is greedy"),
    "top_p": _impl("nucleus sampling, above 0 to 1"),
    "user": _impl(USER),
    "frequency_penalty": _impl(PENALTIES),
    "presence_penalty": _impl(PENALTIES),
    "logit_bias": _impl(LOGIT_BIAS),
    "n": _impl(N),
}
# Every parameter of the pinned SDK's chat.completions.create, completions.create and
# embeddings.create, in the SDK's order (docs/API.md's table; tests/unit/test_parameters.py
# keeps the three equal).
PARAMETERS: dict[str, dict[str, Param]] = {
    CHAT: {
        "messages": _impl("roles `system`, `developer`, `user`, `assistant`, `tool`; text "
                          "only (see `messages` below)"),
        "model": _impl("a registered chat model (`GET /v1/models`)"),
        "audio": _refused("audio output is not implemented"),
        "frequency_penalty": SHARED["frequency_penalty"],
        "function_call": _only(FUNCTIONS, "none"),
        "functions": _refused(FUNCTIONS),
        "logit_bias": SHARED["logit_bias"],
        "logprobs": _impl("each choice's tokens with their log probabilities (see Log "
                          "probabilities), streamed too"),
        "max_completion_tokens": _impl(MAX_TOKENS + "; wins over `max_tokens`"),
        "max_tokens": SHARED["max_tokens"],
        "metadata": _only("completions are not stored: there is nothing to attach it to", {}),
        "modalities": _only("text output only", ["text"]),
        "moderation": _refused("moderation is not implemented"),
        "n": SHARED["n"],
        "parallel_tool_calls": _impl(PARALLEL),
        "prediction": _refused("predicted outputs are not implemented"),
        "presence_penalty": SHARED["presence_penalty"],
        "prompt_cache_key": _refused(PROMPT_CACHE),
        "prompt_cache_options": _refused(PROMPT_CACHE),
        "prompt_cache_retention": _refused(PROMPT_CACHE),
        "reasoning_effort": _refused("the served models do not reason"),
        "response_format": _impl("`text`; `json_object` (JSON mode: one JSON object); "
                                 "`json_schema` (structured outputs: JSON valid for its "
                                 "`schema`, enforced token by token; a schema that cannot "
                                 "be enforced is a 400 saying why). See Structured outputs"),
        "safety_identifier": _refused("inferq does no abuse monitoring by end user"),
        "seed": SHARED["seed"],
        "service_tier": _only("a realtime request runs in the default tier (flex is a batch "
                              "option)", "auto", "default"),
        "stop": SHARED["stop"],
        "store": _only("completions are not stored", False),
        "stream": SHARED["stream"],
        "stream_options": SHARED["stream_options"],
        "temperature": SHARED["temperature"],
        "tool_choice": _impl(TOOL_CHOICE),
        "tools": _impl("function tools (see `tools[]` below), on a model whose chat template "
                       "renders tools; other tool types are refused"),
        "top_logprobs": _impl("0 to 20 most likely tokens at each position; needs "
                              "`logprobs: true`"),
        "top_p": SHARED["top_p"],
        "user": SHARED["user"],
        "verbosity": _refused("verbosity control is not implemented"),
        "web_search_options": _refused("web search is not implemented"),
    },
    COMPLETIONS: {
        "model": _impl("a registered chat model (`GET /v1/models`)"),
        "prompt": _impl("one prompt: a string, or a list of one string (no token-id prompts)"),
        "best_of": _impl("1 to 20, at least `n`: that many sequences, the `n` with the "
                         "highest mean log probability per token returned; not with `stream`"),
        "echo": _impl("the prompt before each choice's text (with `logprobs`, its tokens "
                      "too, the first one's log probability null)"),
        "frequency_penalty": SHARED["frequency_penalty"],
        "logit_bias": SHARED["logit_bias"],
        "logprobs": _impl("0 to 5: each token's log probability and the `logprobs` most "
                          "likely tokens at its position (see Log probabilities)"),
        "max_tokens": SHARED["max_tokens"],
        "n": SHARED["n"],
        "presence_penalty": SHARED["presence_penalty"],
        "seed": SHARED["seed"],
        "stop": SHARED["stop"],
        "stream": SHARED["stream"],
        "stream_options": SHARED["stream_options"],
        "suffix": _refused("insertion (text after the completion) is not implemented"),
        "temperature": SHARED["temperature"],
        "top_p": SHARED["top_p"],
        "user": SHARED["user"],
    },
    EMBEDDINGS: {
        "input": _impl("a string, strings, token ids or lists of token ids; none longer than "
                       "the model's context"),
        "model": _impl("a registered embeddings model (`GET /v1/models`)"),
        "dimensions": _impl("the first `dimensions` values, renormalized; at most the "
                            "model's size; only for a model trained for shortened vectors "
                            "(`matryoshka` in `GET /v1/models`), else 400"),
        "encoding_format": _impl("`float` or `base64` (little-endian float32)"),
        "user": SHARED["user"],
    },
}
# The fields of a message, by role (the SDK's message types); ``function`` messages are
# refused whole.
MESSAGE_FIELDS: dict[str, Param] = {
    "role": _impl("`system`, `developer` (read as `system`), `user`, `assistant`, `tool` (a "
                  "call's result, on a model whose chat template renders tools); `function` "
                  "is refused (" + FUNCTIONS + ")"),
    "content": _impl("a string, or `text` parts (joined); other part types are refused: the "
                     "models read text only"),
    "name": _impl("checked (at most 256 characters); the chat template does not use it"),
    "audio": _refused("audio is not implemented"),
    "function_call": _refused(FUNCTIONS),
    "refusal": _refused("refusals are not implemented"),
    "tool_calls": _impl("an assistant message's function calls (`{id, type: \"function\", "
                        "function: {name, arguments}}`), rendered by the chat template"),
    "tool_call_id": _impl("a tool message's: the id of the call it answers"),
}
ROLE_FIELDS: dict[str, tuple[str, ...]] = {
    "system": ("content", "role", "name"), "developer": ("content", "role", "name"),
    "user": ("content", "role", "name"),
    "assistant": ("role", "audio", "content", "function_call", "name", "refusal",
                  "tool_calls"),
    "tool": ("content", "role", "tool_call_id"),
}
REFUSED_ROLES = ("function",)
# A function tool of ``tools`` and its ``function``.
TOOL_FIELDS: dict[str, Param] = {
    "type": _impl("`function`; other tool types (`custom`) are refused"),
    "function": _impl("see `tools[].function`"),
}
FUNCTION_FIELDS: dict[str, Param] = {
    "name": _impl("letters, digits, `_` and `-`, at most 64 characters; unique in `tools`"),
    "description": _impl("given to the chat template"),
    "parameters": _impl("a JSON schema (none: no parameters); a required call's arguments "
                        "are valid for it, and a schema that cannot be enforced is a 400"),
    "strict": _impl("accepted; a required call's arguments follow the schema whatever it "
                    "says, and `auto` calls are not checked against it"),
}
TEXT_PART_FIELDS: dict[str, Param] = {
    "text": _impl("the text"),
    "type": _impl("`text` only"),
    "prompt_cache_breakpoint": _refused(PROMPT_CACHE),
}
STREAM_OPTIONS: dict[str, Param] = {
    "include_obfuscation": _only("stream chunks are not obfuscated", False),
    "include_usage": _impl("one more chunk with `usage`, before `[DONE]`"),
}
# Each endpoint's model: its fields are exactly the table's implemented parameters.
BODIES: dict[str, type[BaseModel]] = {CHAT: ChatBody, COMPLETIONS: CompletionBody,
                                      EMBEDDINGS: EmbeddingsBody}


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


def _unsupported_tool(kind: str, at: str) -> InvalidRequest:
    return InvalidRequest(f"{at}: unsupported parameter: tools of type {shown(kind, 64)} "
                          "are not supported: inferq takes function tools only (type "
                          "'function')", param=at, code=UNSUPPORTED)


def _tool(tool: Any, at: str) -> Any:
    if not isinstance(tool, dict):
        return tool  # the model refuses it
    kind = tool.get("type")
    if isinstance(kind, str) and kind != "function":
        raise _unsupported_tool(kind, f"{at}.type")
    out = _judged(tool, TOOL_FIELDS, f"{at}.", "a function tool", keep_null={"type",
                                                                            "function"})
    if isinstance(out.get("function"), dict):
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
                    f"{' or '.join(_json(v) for v in p.noop)} or null, got "
                    f"{_json_value(value)}: {p.note}", param=param, code=UNSUPPORTED)
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
    if role not in ROLE_FIELDS:
        return m  # the model says which roles there are
    fields = {k: MESSAGE_FIELDS[k] for k in ROLE_FIELDS[role]}
    out = _judged(m, fields, f"{at}.", f"a {role} message", keep_null={"role", "content"})
    for j, call in enumerate(out.get("tool_calls") or []):
        if isinstance(call, dict) and isinstance(call.get("type"), str) and \
                call["type"] != "function":
            raise InvalidRequest(f"{at}.tool_calls.{j}.type: unsupported parameter: calls of "
                                 f"type {shown(call['type'], 64)} are not supported: function "
                                 "calls only", param=f"{at}.tool_calls.{j}.type",
                                 code=UNSUPPORTED)
    if isinstance(out.get("content"), list):
        out["content"] = [_part(part, f"{at}.content.{j}")
                          for j, part in enumerate(out["content"])]
    return out


def _part(part: Any, at: str) -> Any:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        return part  # the model refuses it
    if part["type"] != "text":
        raise InvalidRequest(f"{at}.type: unsupported parameter: content parts of type "
                             f"{shown(part['type'], 64)} are not supported: the models read "
                             "text only (parts of type 'text')", param=f"{at}.type",
                             code=UNSUPPORTED)
    return _judged(part, TEXT_PART_FIELDS, f"{at}.", "a text part", keep_null={"text"})


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


def _json(v: Any) -> str:
    """A no-op value as a client writes it (``0``, not ``0.0``)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return orjson.dumps(v).decode()


# The SDK method each endpoint's table is of, as docs/API.md names it.
METHODS = {CHAT: "chat.completions.create", COMPLETIONS: "completions.create",
           EMBEDDINGS: "embeddings.create"}
NESTED = {"messages[]": MESSAGE_FIELDS, "messages[].content[]": TEXT_PART_FIELDS,
          "stream_options": STREAM_OPTIONS, "tools[]": TOOL_FIELDS,
          "tools[].function": FUNCTION_FIELDS}


def parameter_table() -> str:
    """docs/API.md's tables of the parameters, as Markdown (its test compares them)."""
    def row(*cells: str) -> str:
        return "| " + " | ".join(cells) + " |"

    def accepted(p: Param) -> str:
        if p.status == IMPLEMENTED:
            return "any valid value"
        return ", ".join(f"`{_json(v)}`" for v in (*p.noop, None))

    lines = [row("method", "parameter", "status", "accepted", "note"), row(*["---"] * 5)]
    for endpoint, table in PARAMETERS.items():
        lines += [row(f"`{METHODS[endpoint]}`", f"`{name}`", p.status, accepted(p), p.note)
                  for name, p in table.items()]
    lines += ["", row("object", "field", "status", "accepted", "note"), row(*["---"] * 5)]
    for obj, table in NESTED.items():
        lines += [row(f"`{obj}`", f"`{name}`", p.status, accepted(p), p.note)
                  for name, p in table.items()]
    return "\n".join(lines) + "\n"


# Responses (/v1/responses) ------------------------------------------------------------------
#
# A Responses request is a chat request with other names: ``instructions`` is a system
# message first, ``input`` a string is one user message, and input message items (an
# earlier answer's output message included) are messages, their text parts joined. It
# is validated here as itself (every parameter of the SDK's responses.create in the
# table below) and runs as the chat body ``chat_body`` makes of it, on the chat path:
# the same lane, limits, admission, usage and tracing. Its answer is the Response object
# built from the chat answer (jobs.protocol.responses).

MAX_METADATA, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class InputPart(BaseModel):
    """A text part of an input message: ``input_text``, or an earlier answer's
    ``output_text``."""

    model_config = BODY

    type: Literal["input_text", "output_text"]
    text: Text


class InputItem(BaseModel):
    """A message item of ``input``: an easy input message, an input message or an
    earlier output message (their fields; ``id`` and ``status`` are checked, else
    unused)."""

    model_config = BODY

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[InputPart]
    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        c = self.content
        return c if isinstance(c, str) else "".join(p.text for p in c)


class FunctionCallItem(BaseModel):
    """An earlier answer's ``function_call`` output item, as input."""

    model_config = BODY

    type: Literal["function_call"]
    call_id: Name
    name: Name
    arguments: Text
    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def call(self) -> dict[str, Any]:
        """As a chat assistant message's call."""
        return {"id": self.call_id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class FunctionCallOutputItem(BaseModel):
    """A ``function_call_output`` input item: a call's result, a chat tool message."""

    model_config = BODY

    type: Literal["function_call_output"]
    call_id: Name
    output: Text | list[InputPart]
    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        o = self.output
        return o if isinstance(o, str) else "".join(p.text for p in o)


def _item_type(v: Any) -> str:
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", "message")
    return kind if kind in ("function_call", "function_call_output") else "message"


Item = Annotated[Annotated[InputItem, Tag("message")]
                 | Annotated[FunctionCallItem, Tag("function_call")]
                 | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
                 Discriminator(_item_type)]


class TextConfig(BaseModel):
    """``text``: its ``format``, chat's ``response_format`` (TEXT_CONFIG)."""

    model_config = BODY

    format: TextFormat | None = None


class ResponseStreamOptions(BaseModel):
    model_config = BODY


class ResponsesBody(BaseModel):
    model_config = BODY

    model: Name
    input: Text | list[Item]
    instructions: Text | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    metadata: dict[str, str] | None = None
    stream: bool = False
    stream_options: ResponseStreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    text: TextConfig | None = None
    top_p: float = Field(default=1.0, gt=0, le=1)
    user: Name | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _tool_choice(self) -> ResponsesBody:
        tools_checked(self.tools, self.tool_choice,
                      self.text.format.response_format() if self.text is not None and
                      self.text.format is not None else None)
        return self

    def uses_tools(self) -> bool:
        """Tools or calls in the input: the model's chat template must render them."""
        return bool(self.tools) or (isinstance(self.input, list) and any(
            not isinstance(x, InputItem) for x in self.input))

    @field_validator("input")
    @classmethod
    def _input(cls, v: Any) -> Any:
        if not v:
            raise ValueError("input: expected a non-empty string or a non-empty list of "
                             "message items")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > MAX_METADATA:
            raise ValueError(f"metadata: at most {MAX_METADATA} key-value pairs")
        if any(len(k) > MAX_METADATA_KEY for k in v):
            raise ValueError(f"metadata: keys are at most {MAX_METADATA_KEY} characters")
        if any(len(x) > MAX_METADATA_VALUE for x in v.values()):
            raise ValueError(f"metadata: values are at most {MAX_METADATA_VALUE} "
                             "characters")
        return v


def parse_responses(body: Any, models: ServedModels | None = None) -> ResponsesBody:
    """Validate a Responses body (everything that needs no tokenizer); ``models`` as for
    parse_embeddings."""
    req: ResponsesBody = parse_model(ResponsesBody, supported(RESPONSES, body))
    if models is not None:
        info = models.require(req.model, RESPONSES)
        if req.uses_tools() and info.tools is False:
            raise no_tools(req.model)
    return req


def chat_body(req: ResponsesBody) -> dict[str, Any]:
    """The chat completions body a Responses request runs as (a valid ChatBody)."""
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        for item in req.input:
            if isinstance(item, InputItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append({"role": "tool", "content": item.text(),
                                 "tool_call_id": item.call_id})
            elif messages and messages[-1]["role"] == "assistant":
                # a call follows its answer's text (or the calls before it)
                messages[-1].setdefault("tool_calls", []).append(item.call())
            else:
                messages.append({"role": "assistant", "content": None,
                                 "tool_calls": [item.call()]})
    body: dict[str, Any] = {"model": req.model, "messages": messages,
                            "temperature": req.temperature, "top_p": req.top_p}
    if req.tools:
        body["tools"] = [t.chat() for t in req.tools]
    if req.tool_choice is not None:
        c = req.tool_choice
        body["tool_choice"] = c if isinstance(c, str) else {
            "type": "function", "function": {"name": c.name}}
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.user is not None:
        body["user"] = req.user
    if req.text is not None and req.text.format is not None and \
            req.text.format.type != "text":
        body["response_format"] = req.text.format.response_format().model_dump(
            exclude_none=True)
    return body


def as_chat(endpoint: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The endpoint and body a valid request runs as: a Responses body's chat body, on
    /v1/chat/completions; any other request as it is."""
    if endpoint == RESPONSES:
        return CHAT, chat_body(parse_model(ResponsesBody, body))
    return endpoint, body


STORE = ("responses are not stored (inferq keeps nothing it could return later): store "
         "absent is false here, where OpenAI's default is true")
NO_LOGPROBS = "/v1/responses returns no log probabilities"
NOT_STORED = ("responses are not stored: send the earlier turns in `input` (an answer's "
              "output message is an input item)")
PARAMETERS[RESPONSES] = {
    "access_programs": _refused("OpenAI's access programs do not exist here"),
    "background": _only("background responses are not implemented: POST /v1/jobs with "
                        "endpoint /v1/responses runs one asynchronously", False),
    "background_options": _refused("background responses are not implemented"),
    "context_management": _refused("context management (compaction) is not implemented"),
    "conversation": _refused("conversations are not stored"),
    "image": _refused("image input is not implemented"),
    "include": _only("nothing more can be included: no log probabilities, reasoning or tool "
                     "outputs", []),
    "input": _impl("a string (one user message), or message items (see `input[]` below)"),
    "instructions": _impl("a system message before the input"),
    "max_output_tokens": _impl(MAX_TOKENS + "; reached: `status: incomplete`"),
    "max_tool_calls": _refused("a limit on calls is not implemented (`parallel_tool_calls: "
                               "false` asks for at most one)"),
    "metadata": _impl("at most 16 pairs (keys up to 64, values up to 512 characters); "
                      "echoed in the response object"),
    "model": _impl("a registered chat model (`GET /v1/models`)"),
    "moderation": _refused("moderation is not implemented"),
    "parallel_tool_calls": _impl(PARALLEL),
    "previous_response_id": _refused(NOT_STORED),
    "prompt": _refused("stored prompt templates are not implemented"),
    "prompt_cache_key": _refused(PROMPT_CACHE),
    "prompt_cache_options": _refused(PROMPT_CACHE),
    "prompt_cache_retention": _refused(PROMPT_CACHE),
    "reasoning": _refused("the served models do not reason"),
    "safety_identifier": _refused("inferq does no abuse monitoring by end user"),
    "service_tier": _only("a realtime request runs in the default tier (flex is a batch "
                          "option)", "auto", "default"),
    "store": _only(STORE, False),
    "stream": _impl("server-sent events of the Responses API (see Responses)"),
    "stream_options": _impl("see `stream_options (responses.create)` below"),
    "temperature": SHARED["temperature"],
    "text": _impl("see `text` below: plain text only"),
    "tool_choice": _impl("`none`, `auto` (the default with tools), `required`, or "
                         "`{\"type\": \"function\", \"name\"}`: as chat's (see Tool calls)"),
    "tools": _impl("function tools (see `tools[] (responses.create)` below), on a model "
                   "whose chat template renders tools; other tool types are refused"),
    "top_logprobs": _refused(NO_LOGPROBS),
    "top_p": SHARED["top_p"],
    "truncation": _only("input is never truncated: a prompt over the context is 400 "
                        "`context_length_exceeded`", "disabled"),
    "user": SHARED["user"],
}
# The fields of an input message item, by role: the SDK's easy input message, input
# message and (for assistant) output message types together.
INPUT_ITEM_FIELDS: dict[str, Param] = {
    "type": _impl("`message` (the default); `function_call` and `function_call_output` "
                  "items are below; other item types (reasoning, item references, other "
                  "tools' calls) are refused"),
    "role": _impl("`system`, `developer` (read as `system`), `user`, `assistant`"),
    "content": _impl("a string, or text parts (joined; see `input[].content[]`)"),
    "id": _impl("an earlier output message's: checked (at most 256 characters), else unused"),
    "status": _impl("an earlier output message's: checked, else unused"),
    "phase": _refused("phases are not implemented: the served models write final answers "
                      "only"),
}
ITEM_ROLE_FIELDS: dict[str, tuple[str, ...]] = {
    **{role: ("content", "role", "phase", "status", "type")
       for role in ("system", "developer", "user")},
    "assistant": ("id", "content", "role", "status", "type", "phase"),
}
INPUT_PART_FIELDS: dict[str, Param] = {
    "text": _impl("the text"),
    "type": _impl("`input_text`, or `output_text` (an earlier answer's); other part types "
                  "(`input_image`, `input_file`, `refusal`) are refused: the models read "
                  "text only"),
    "annotations": _only("annotations are not implemented", []),
    "logprobs": _only(NO_LOGPROBS, []),
    "prompt_cache_breakpoint": _refused(PROMPT_CACHE),
}
PART_TYPE_FIELDS: dict[str, tuple[str, ...]] = {
    "input_text": ("text", "type", "prompt_cache_breakpoint"),
    "output_text": ("annotations", "text", "type", "logprobs"),
}
TEXT_CONFIG: dict[str, Param] = {
    "format": _impl("`text`; `json_object`; `json_schema` (`name`, `schema`, `strict`, "
                    "`description`): structured outputs as chat's `response_format` (see "
                    "Structured outputs)"),
    "verbosity": _refused("verbosity control is not implemented"),
}
RESPONSES_TOOL_FIELDS: dict[str, Param] = {
    "type": _impl("`function`; other tool types (web search, file search, MCP, custom, …) "
                  "are refused"),
    "name": FUNCTION_FIELDS["name"],
    "description": FUNCTION_FIELDS["description"],
    "parameters": FUNCTION_FIELDS["parameters"],
    "strict": FUNCTION_FIELDS["strict"],
    "allowed_callers": _refused("programmatic tool calling is not implemented"),
    "async": _only("calls are answered in the next request's input", False),
    "defer_loading": _only("tool search is not implemented: every tool is given to the "
                           "model", False),
    "output_schema": _refused("output schemas are not implemented"),
}
CALL_STATUS = "an earlier answer's: checked, else unused"
FUNCTION_CALL_FIELDS: dict[str, Param] = {
    "type": _impl("`function_call`: an earlier answer's call (an assistant message's "
                  "`tool_calls` to the chat template)"),
    "call_id": _impl("the call's id"),
    "name": _impl("the function called"),
    "arguments": _impl("its arguments (JSON text)"),
    "id": _impl("an earlier output item's: checked (at most 256 characters), else unused"),
    "status": _impl(CALL_STATUS),
    "caller": _refused("programmatic tool calling is not implemented"),
    "namespace": _refused("tool namespaces are not implemented"),
    "async": _only("calls are answered in the next request's input", False),
}
FUNCTION_CALL_OUTPUT_FIELDS: dict[str, Param] = {
    "type": _impl("`function_call_output`: a call's result (a `tool` message to the chat "
                  "template)"),
    "call_id": _impl("the id of the call it answers"),
    "output": _impl("a string, or `input_text` parts (joined)"),
    "id": _impl("checked (at most 256 characters), else unused"),
    "status": _impl(CALL_STATUS),
    "caller": _refused("programmatic tool calling is not implemented"),
    "name": _refused("the output is matched to its call by `call_id`"),
    "namespace": _refused("tool namespaces are not implemented"),
}
RESPONSE_STREAM_OPTIONS: dict[str, Param] = {
    "include_obfuscation": _only("stream events are not obfuscated", False),
}
BODIES[RESPONSES] = ResponsesBody
METHODS[RESPONSES] = "responses.create"
NESTED.update({"input[]": INPUT_ITEM_FIELDS, "input[].content[]": INPUT_PART_FIELDS,
               "input[] (function_call)": FUNCTION_CALL_FIELDS,
               "input[] (function_call_output)": FUNCTION_CALL_OUTPUT_FIELDS,
               "tools[] (responses.create)": RESPONSES_TOOL_FIELDS,
               "text": TEXT_CONFIG, "stream_options (responses.create)": RESPONSE_STREAM_OPTIONS})
ITEM_TYPE_FIELDS = {"function_call": FUNCTION_CALL_FIELDS,
                    "function_call_output": FUNCTION_CALL_OUTPUT_FIELDS}


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
    if not isinstance(tool, dict):
        return tool  # the model refuses it
    kind = tool.get("type")
    if isinstance(kind, str) and kind != "function":
        raise _unsupported_tool(kind, f"{at}.type")
    return _judged(tool, RESPONSES_TOOL_FIELDS, f"{at}.", "a function tool",
                   keep_null={"type", "name"})


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
    role = item.get("role")
    if role not in ITEM_ROLE_FIELDS:
        return item  # the model says which roles there are
    fields = {k: INPUT_ITEM_FIELDS[k] for k in ITEM_ROLE_FIELDS[role]}
    out = _judged(item, fields, f"{at}.", f"a {role} message item",
                  keep_null={"role", "content"})
    if isinstance(out.get("content"), list):
        out["content"] = [_input_part(p, f"{at}.content.{j}")
                          for j, p in enumerate(out["content"])]
    return out


def _input_part(part: Any, at: str) -> Any:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        return part  # the model refuses it
    kind = part["type"]
    if kind not in PART_TYPE_FIELDS:
        raise InvalidRequest(f"{at}.type: unsupported parameter: content parts of type "
                             f"{shown(kind, 64)} are not supported: the models read text "
                             "only (parts of type 'input_text' or 'output_text')",
                             param=f"{at}.type", code=UNSUPPORTED)
    fields = {k: INPUT_PART_FIELDS[k] for k in PART_TYPE_FIELDS[kind]}
    return _judged(part, fields, f"{at}.", f"an {kind} part", keep_null={"text", "type"})
