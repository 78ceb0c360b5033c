"""A batch's failed requests summarised for ``inferq status``: its error file read
back (JSONL lines or Parquet rows), one group per error code with its count, the
message of its first request and the first few of its requests (custom_id and the
line of the error file)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

SAMPLES = 3  # requests named per code
MAX_BYTES = 256 * 1024**2  # an error file beyond this is summarised from its start


@dataclass
class Group:
    code: str
    message: str
    count: int = 0
    samples: list[tuple[int, str]] = field(default_factory=list)  # (line, custom_id)


def _error(line: dict[str, Any]) -> dict[str, Any]:
    """A line's error: of a request that never ran, or in a non-200 response's body."""
    resp, err = line.get("response"), line.get("error")
    if isinstance(resp, dict) and resp.get("status_code") != 200:
        body = resp.get("body")
        err = body.get("error") if isinstance(body, dict) else err
    return err if isinstance(err, dict) else {}


def _jsonl(data: bytes) -> Iterator[tuple[str | None, str | None, str]]:
    for raw in data.splitlines():
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a line cut short by MAX_BYTES
        err = _error(line) if isinstance(line, dict) else {}
        yield (err.get("code") if isinstance(err.get("code"), str) else None,
               err.get("message") if isinstance(err.get("message"), str) else None,
               str(line.get("custom_id")) if isinstance(line, dict) else "?")


def _parquet(data: bytes) -> Iterator[tuple[str | None, str | None, str]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(io.BytesIO(data))
    for rb in pf.iter_batches(columns=["custom_id", "error_code", "error_message"]):
        for cid, code, message in zip(*(c.to_pylist() for c in rb.columns), strict=True):
            yield code, message, str(cid)


def row_errors(client: Any, file_id: str) -> list[Group]:
    """The groups of the error file ``file_id``, the most frequent code first."""
    from storage.parquet import is_parquet

    with client.files.with_streaming_response.content(file_id) as resp:
        buf = bytearray()
        for block in resp.iter_bytes():
            buf += block
            if len(buf) >= MAX_BYTES:
                break
    data = bytes(buf)
    rows = _parquet(data) if is_parquet(data[:64]) else _jsonl(data)
    groups: dict[str, Group] = {}
    for n, (code, message, cid) in enumerate(rows, start=1):
        g = groups.setdefault(code or "error", Group(code or "error", message or ""))
        g.count += 1
        if len(g.samples) < SAMPLES:
            g.samples.append((n, cid))
    return sorted(groups.values(), key=lambda g: -g.count)


def describe(g: Group) -> str:
    """``code: N requests, e.g. line 3 (review-7), …: message``."""
    shown = ", ".join(f"line {n} ({cid})" for n, cid in g.samples)
    more = ", …" if g.count > len(g.samples) else ""
    noun = "request" if g.count == 1 else "requests"
    message = g.message if len(g.message) <= 200 else g.message[:199] + "…"
    return f"{g.code}: {g.count} {noun}, {shown}{more}: {message}"
