"""Parquet layouts for shards and dataset inputs/outputs."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SHARD_SCHEMA = pa.schema([
    ("line", pa.int64()),        # 1-based position in the input file
    ("custom_id", pa.string()),
    ("body", pa.string()),       # the request body as JSON text
    ("length", pa.int32()),      # size estimate used for sorting
])


def shard_bytes(rows: list[tuple[int, str, str, int]]) -> bytes:
    """Rows sorted by length (shortest first) so neighbouring rows pad alike."""
    rows = sorted(rows, key=lambda r: r[3])
    table = pa.Table.from_arrays(
        [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(SHARD_SCHEMA)],
        schema=SHARD_SCHEMA,
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def read_rows(path: Path | io.BytesIO, start: int = 0) -> list[dict[str, Any]]:
    """All rows of a shard from position ``start`` (shards are small: ~1e3 rows)."""
    table = pq.read_table(path)
    return table.slice(start).to_pylist()


def iter_dataset(path: Path, batch_rows: int = 10_000) -> Iterator[list[dict[str, Any]]]:
    """Row batches of an uploaded Parquet dataset, streamed by row group."""
    pf = pq.ParquetFile(path)
    for rb in pf.iter_batches(batch_size=batch_rows):
        yield rb.to_pylist()


def dataset_columns(path: Path) -> list[str]:
    return list(pq.ParquetFile(path).schema_arrow.names)


def is_parquet(head: bytes) -> bool:
    return head[:4] == b"PAR1"


OUTPUT_SCHEMA = pa.schema([
    ("custom_id", pa.string()),
    ("status_code", pa.int32()),       # null when the request never ran
    ("embedding", pa.list_(pa.float32())),
    ("prompt_tokens", pa.int32()),
    ("error_code", pa.string()),
    ("error_message", pa.string()),
])


def _output_row(line: dict[str, Any]) -> dict[str, Any]:
    resp, err = line.get("response"), line.get("error")
    row: dict[str, Any] = {"custom_id": line["custom_id"], "status_code": None,
                           "embedding": None, "prompt_tokens": None, "error_code": None,
                           "error_message": None}
    if resp is not None:
        row["status_code"] = resp["status_code"]
        body = resp.get("body") or {}
        if resp["status_code"] == 200:
            row["embedding"] = body["data"][0]["embedding"]
            row["prompt_tokens"] = body.get("usage", {}).get("prompt_tokens")
        else:
            err = body.get("error")
    if err:
        row["error_code"], row["error_message"] = err.get("code"), err.get("message")
    return row


def jsonl_to_parquet(blocks: Iterator[bytes], path: Path, rows_per_group: int = 5000) -> int:
    """Convert batch output lines (streamed blocks of JSONL) to a Parquet file; returns rows."""
    import orjson

    n = 0
    pending: list[dict[str, Any]] = []
    tail = b""
    with pq.ParquetWriter(path, OUTPUT_SCHEMA, compression="zstd") as w:
        def flush() -> None:
            if pending:
                w.write_table(pa.Table.from_pylist(pending, schema=OUTPUT_SCHEMA))
                pending.clear()

        for block in blocks:
            parts = (tail + block).split(b"\n")
            tail = parts.pop()
            for raw in parts:
                if raw.strip():
                    pending.append(_output_row(orjson.loads(raw)))
                    n += 1
            if len(pending) >= rows_per_group:
                flush()
        if tail.strip():
            pending.append(_output_row(orjson.loads(tail)))
            n += 1
        flush()
    return n
