"""Typed request bodies shared by the API (synchronous calls) and batch validation.

One definition per endpoint, so a batch line and a direct call are judged alike.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from jobs.errors import InvalidRequest

EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ENDPOINTS = (EMBEDDINGS, CHAT, COMPLETIONS)

# Public model ids and what they serve. Weights: see workers/runtime.
MODELS: dict[str, str] = {"all-MiniLM-L6-v2": "embeddings"}
EMBEDDING_DIM = 384


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

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

    @field_validator("dimensions")
    @classmethod
    def _dims(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= EMBEDDING_DIM:
            raise ValueError(f"dimensions must be between 1 and {EMBEDDING_DIM}")
        return v

    def inputs(self) -> list[str] | list[list[int]]:
        """Normalised to a list of texts or a list of token-id lists."""
        v = self.input
        if isinstance(v, str):
            return [v]
        if isinstance(v[0], int):
            return [cast(list[int], v)]
        return cast(list[str] | list[list[int]], list(v))


def parse_embeddings(body: Any, max_inputs: int) -> EmbeddingsBody:
    """Validate an embeddings body; raises InvalidRequest naming the offending param."""
    req: EmbeddingsBody = parse_model(EmbeddingsBody, body)
    if req.model not in MODELS or MODELS[req.model] != "embeddings":
        raise InvalidRequest(f"The model '{req.model}' does not exist or is not an embeddings "
                             "model", param="model", code="model_not_found")
    if len(req.inputs()) > max_inputs:
        raise InvalidRequest(f"input: at most {max_inputs} inputs per request", param="input")
    return req


def text_length(body: dict[str, Any]) -> int:
    """A cheap size estimate used to sort rows inside a shard (no tokenizer here)."""
    v = body.get("input")
    if isinstance(v, str):
        return len(v)
    if isinstance(v, list):
        return sum(len(x) if isinstance(x, str | list) else 1 for x in v)
    return 0


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    service_tier: Literal["default", "flex", "auto"] = "default"
    # inferq extension: request defaults for Parquet inputs (e.g. {"model": ...}).
    body: dict[str, Any] = Field(default_factory=dict)
    callback_url: str | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}")
        if v != EMBEDDINGS:
            raise ValueError(f"endpoint {v} is not served by this deployment yet "
                             f"(served: {EMBEDDINGS})")
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
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(f"{param}: {msg}" if param else msg, param=param) from e
