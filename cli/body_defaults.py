"""``inferq submit``'s request defaults: the batch's ``body`` (every request's
parameters, under a JSONL line's own fields; beside a dataset's or a Parquet file's
input column), from ``--max-tokens``, ``--temperature``, ``--response-format``,
``--body-default KEY=JSON`` and ``--defaults @file.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

RESPONSES, COMPLETIONS = "/v1/responses", "/v1/completions"


def _read_json(value: str, option: str) -> Any:
    """``@path`` (a JSON file) or inline JSON text."""
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text()
        except OSError as e:
            raise click.BadParameter(f"cannot read {path}: {e.strerror}",
                                     param_hint=option) from None
        where = str(path)
    else:
        text, where = value, "the value"
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"{where} is not JSON: {e}", param_hint=option) from None


def response_format(value: str) -> dict[str, Any]:
    """``text``, ``json_object``, a ``response_format`` object, or a JSON schema (inline
    or ``@schema.json``): that schema as ``{"type": "json_schema", ...}``, named after
    the file (or its ``title``)."""
    if value in ("text", "json_object"):
        return {"type": value}
    doc = _read_json(value, "--response-format")
    if not isinstance(doc, dict):
        raise click.BadParameter("a JSON schema (an object) is expected",
                                 param_hint="--response-format")
    if doc.get("type") in ("json_schema", "json_object", "text") and (
            doc["type"] != "json_schema" or "json_schema" in doc):
        return doc  # already a response_format
    name = doc.get("title") if isinstance(doc.get("title"), str) else None
    if name is None:
        name = Path(value[1:]).stem if value.startswith("@") else "schema"
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:64] or "schema"
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": doc, "strict": True}}


def body_defaults(endpoint: str, model: str | None, max_tokens: int | None,
                  temperature: float | None, fmt: str | None, pairs: tuple[str, ...],
                  defaults_file: str | None) -> dict[str, Any]:
    """The batch's ``body``: ``--defaults`` first, then each ``--body-default``, then
    the named options (each later one wins). ``max_tokens`` is ``max_output_tokens``
    for /v1/responses, and a response format its ``text.format``."""
    body: dict[str, Any] = {}
    if defaults_file is not None:
        doc = _read_json(defaults_file, "--defaults")
        if not isinstance(doc, dict):
            raise click.BadParameter("a JSON object of request parameters is expected",
                                     param_hint="--defaults")
        body.update(doc)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=JSON (e.g. top_p=0.9, "
                                     "stop='[\"\\n\"]')", param_hint="--body-default")
        try:
            body[key] = json.loads(value)
        except json.JSONDecodeError:
            body[key] = value  # a bare word is a string: --body-default user=team-a
    if model is not None:
        body["model"] = model
    if max_tokens is not None:
        body["max_output_tokens" if endpoint == RESPONSES else "max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if fmt is not None:
        rf = response_format(fmt)
        if endpoint == RESPONSES:  # the Responses API's shape: text.format, flat
            inner = rf.get("json_schema", {})
            body["text"] = {**body.get("text", {}), "format": {"type": rf["type"], **inner}}
        else:
            body["response_format"] = rf
    return body
