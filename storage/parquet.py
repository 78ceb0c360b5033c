"""Parquet files: shard layout, reading uploaded datasets, writing rows of a given schema."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
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


def write_rows(path: Path, schema: pa.Schema, rows: Iterable[dict[str, Any]],
               rows_per_group: int = 5000) -> int:
    """Write rows (dicts keyed by the schema's column names) to a Parquet file, streamed
    by row group; returns the number of rows."""
    n = 0
    pending: list[dict[str, Any]] = []
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        for row in rows:
            pending.append(row)
            n += 1
            if len(pending) >= rows_per_group:
                w.write_table(pa.Table.from_pylist(pending, schema=schema))
                pending.clear()
        if pending:
            w.write_table(pa.Table.from_pylist(pending, schema=schema))
    return n
