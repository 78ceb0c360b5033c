"""What every resource's answers share: the base of the response models (``Out``), the
error shape, a cursor page and a deletion's answer.

A response model is the one statement of its shape: the routes (and the workers) build
their answers with it, and /openapi.json describes it. Every field is sent (OpenAI
objects are sent whole, null where there is nothing), so the schema lists each as
required; nothing else is sent (``extra="forbid"``).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


def _every_field_sent(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """Every field is required, but one sent only when set (``exclude_if``)."""
    schema["required"] = [f.alias or name for name, f in cls.model_fields.items()
                          if f.exclude_if is None]


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_every_field_sent)

    def body(self) -> dict[str, Any]:
        """The answer as JSON-ready data (what a route or a worker sends)."""
        return self.model_dump(mode="json")


class ErrorObject(Out):
    message: str
    type: str
    param: str | None
    code: str | None


class Error(Out):
    """Every error response: the OpenAI error shape."""

    error: ErrorObject


class Page(Out, Generic[T]):
    """A cursor page (``after`` = ``last_id`` for the next one)."""

    object: Literal["list"] = "list"
    data: list[T]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, items: list[T], has_more: bool) -> Self:
        return cls(data=items, first_id=getattr(items[0], "id", None) if items else None,
                   last_id=getattr(items[-1], "id", None) if items else None,
                   has_more=has_more)


class Deleted(Out):
    id: str
    object: str
    deleted: bool


class ReasoningTokens(Out):
    reasoning_tokens: int


