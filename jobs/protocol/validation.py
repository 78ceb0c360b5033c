"""How a request body is validated: the strict field types every body is made of, and
``parse_model``, which reads a body with its model and names the offending parameter.

Every body is validated strictly, as OpenAI does: a JSON string is never a number or a
boolean, a boolean never a number, a number written with a decimal point or an
exponent never an integer, while an integer is a number (``temperature: 1`` is 1.0).
Text that may come from a binary Parquet cell (``Text``) also takes bytes, read as
UTF-8.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError
from pydantic_core import ErrorDetails

from jobs.core.errors import InvalidRequest, shown

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
            msg = f"expected {either}{expected[-1]}, got {json_value(err['input'])}"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
        if param and not msg.startswith((f"{param} ", f"{param}:")):
            msg = f"{param}: {msg}"
        raise InvalidRequest(msg, param=param) from e


# What a value of the wrong JSON type should have been, by pydantic's error type.
EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean",
            "string_type": "a string", "list_type": "an array", "dict_type": "an object",
            "model_type": "an object"}


def json_value(v: Any) -> str:
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


def one_of(name: str, choices: Collection[str]) -> AfterValidator:
    """A field's check that its value is one of ``choices`` (a ValueError names them)."""
    def check(v: str) -> str:
        if v not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}")
        return v

    return AfterValidator(check)


MAX_METADATA, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def check_metadata(v: dict[str, str] | None) -> dict[str, str] | None:
    """An object's ``metadata``: at most 16 pairs, keys of at most 64 characters and
    values of at most 512 (OpenAI's bounds); a ValueError names the one broken."""
    if v is None:
        return v
    if len(v) > MAX_METADATA:
        raise ValueError(f"metadata: at most {MAX_METADATA} key-value pairs")
    if any(len(k) > MAX_METADATA_KEY for k in v):
        raise ValueError(f"metadata: keys are at most {MAX_METADATA_KEY} characters")
    if any(len(x) > MAX_METADATA_VALUE for x in v.values()):
        raise ValueError(f"metadata: values are at most {MAX_METADATA_VALUE} characters")
    return v
