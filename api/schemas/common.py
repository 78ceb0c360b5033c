"""What every resource's answers share: the base of the response models (``Out``), the
error shape, a cursor page (``page`` builds one) and a deletion's answer.

The response models describe for /openapi.json the shapes the routes' builders return.
Every field is required (OpenAI objects are sent whole); nothing else is sent.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


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

    object: Literal["list"]
    data: list[T]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Deleted(Out):
    id: str
    object: str
    deleted: bool


class ReasoningTokens(Out):
    reasoning_tokens: int


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}
