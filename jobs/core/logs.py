"""Logging for every process: text lines (interactive use) or JSON lines (containers).

One JSON object a line: ``ts, level, logger, msg``, then what is known where the line
was written: ``request_id, batch_id, shard_id, project_id`` (set with :func:`bound`
by the API's request and by the worker's task and lane code, in contextvars, so
threads and requests never mix them up), ``trace_id, span_id`` (the current span's,
when tracing is on), and ``exc`` (a traceback).
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import orjson

from jobs.core import tracing
from jobs.core.settings import Settings

FIELDS = ("request_id", "batch_id", "shard_id", "project_id")
_vars: dict[str, contextvars.ContextVar[str | None]] = {
    f: contextvars.ContextVar(f"inferq_log_{f}", default=None) for f in FIELDS}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Log lines written inside the block carry ``fields`` (``None`` leaves one as it
    was); every field, also one :func:`bind` sets inside the block, is as before
    afterwards."""
    tokens = [(var, var.set(fields[k] if fields.get(k) is not None else var.get()))
              for k, var in _vars.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def bind(**fields: str | None) -> None:
    """Set fields for the rest of this context (the API clears them when its request
    ends: a server thread keeps one context across the requests it serves)."""
    for k, v in fields.items():
        if v is not None:
            _vars[k].set(v)


def clear() -> None:
    for var in _vars.values():
        var.set(None)


def current(field: str) -> str | None:
    return _vars[field].get()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        for f, var in _vars.items():
            if (v := var.get()) is not None:
                out[f] = v
        if (ids := tracing.current_ids()) is not None:
            out["trace_id"], out["span_id"] = ids
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup(settings: Settings) -> None:
    """This process's root handler: one line a record on stderr, in the format of
    ``INFERQ_LOG_FORMAT``, at ``INFERQ_LOG_LEVEL``."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "inferq", False):
            root.removeHandler(h)
    # the process's real stderr: a Celery pool child's sys.stderr is a proxy that logs
    handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
    handler.inferq = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if settings.log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    if settings.log_format == "json":  # one format per process: others' handlers go
        for h in list(root.handlers):
            root.removeHandler(h)
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(settings.log_level)
