"""The embeddings request body (/v1/embeddings), and the answer to ``dimensions`` for a
model not trained for shortened vectors."""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, Field, field_validator

from jobs.core.errors import InvalidRequest, shown
from jobs.protocol.validation import BODY, INT64, Name, Text, TokenId


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
