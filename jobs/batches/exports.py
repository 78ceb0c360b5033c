"""Output datasets: a dataset batch's results written where the data team reads them.

A batch created with ``output_dataset`` (an empty prefix under one of its project's
write locations) gets, when it is finalized, one Parquet part per shard
(``part-000000.parquet`` …; ``part-validation.parquet`` for the rows refused at
validation), then ``_manifest.json`` (the parts, their row counts, the schema) and
last ``_SUCCESS``: a reader that sees ``_SUCCESS`` sees every part. A part holds one
row per request of its shard: the input's id column (under its own name), then the
columns of the batch's Parquet output (jobs/batches/outputs.py). Its rows are those the
shard's checkpoints committed (late writes of fenced-off attempts are never read)
and an error row for each request the shard never ran, so every id is there once.
A finalize that runs again rewrites the same parts.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.batches import outputs
from jobs.batches import queries as repo
from jobs.batches.datasets import Manifest
from jobs.batches.views import read_shard
from jobs.core.schema import Batch, Shard, now
from jobs.core.status import ShardStatus
from storage import datasets as ds
from storage import keys
from storage.objects import CHUNK, ObjectNotFound, ObjectStore

SUCCESS = "_SUCCESS"
MANIFEST = "_manifest.json"


def _shard_lines(store: ObjectStore, b: Batch, sh: Shard, reason: str) -> Iterator[bytes]:
    """The output and error lines of one shard: committed parts, then its unrun rows."""
    for kind in ("ok", "err"):
        for chunk in range(sh.chunks_done):
            key = keys.output_part(b.id, sh.index, chunk, kind, repo.part_attempt(sh, chunk))
            yield from store.iter_chunks(key, CHUNK)
    if sh.status == ShardStatus.DONE or sh.rows_done >= sh.rows:
        return
    code, message = ((reason, "the batch ended before this request ran")
                     if sh.status == ShardStatus.CANCELLED else
                     ("shard_failed", sh.error or "the request could not be processed"))
    rows = read_shard(store, sh, start=sh.rows_done)
    yield b"".join(outputs.unrun_line(r["custom_id"], code, message) for r in rows)


def _table(endpoint: str, id_column: str, lines: Iterator[bytes]) -> pa.Table:
    schema = outputs.parquet_schema(endpoint)
    rows = [outputs.parquet_row(endpoint, line) for line in outputs.iter_lines(lines)]
    t = pa.Table.from_pylist(rows, schema=schema)
    if id_column != "custom_id":
        t = t.rename_columns([id_column if n == "custom_id" else n for n in t.column_names])
    return t


def _put(dest: ObjectStore, name: str, t: pa.Table) -> dict[str, Any]:
    buf = io.BytesIO()
    pq.write_table(t, buf, compression="zstd")
    dest.put_bytes(name, buf.getvalue())
    return {"path": name, "rows": t.num_rows, "bytes": buf.tell()}


def write(store: ObjectStore, b: Batch, shards: list[Shard], manifest: Manifest,
          reason: str) -> int:
    """Write the output dataset of ``b`` (see the module); returns its row count.
    ``reason``: the error code of requests a stopped batch never ran."""
    assert manifest.output is not None
    dest = ds.destination(ds.parse(manifest.output))
    parts: list[dict[str, Any]] = []
    try:
        invalid = store.get_bytes(keys.validation_errors(b.id))
    except ObjectNotFound:
        invalid = b""
    if invalid:
        parts.append(_put(dest, "part-validation.parquet",
                          _table(b.endpoint, manifest.id_column, iter([invalid]))))
    for sh in shards:
        t = _table(b.endpoint, manifest.id_column, _shard_lines(store, b, sh, reason))
        parts.append(_put(dest, f"part-{sh.index:06d}.parquet", t))
    schema = outputs.parquet_schema(b.endpoint)
    names = [manifest.id_column if n == "custom_id" else n for n in schema.names]
    rows = sum(p["rows"] for p in parts)
    dest.put_bytes(MANIFEST, orjson.dumps({
        "object": "inferq.output_dataset", "batch_id": b.id, "endpoint": b.endpoint,
        "model": b.model, "input": manifest.uri, "id_column": manifest.id_column,
        "rows": rows, "created_at": now(), "columns": names, "parts": parts,
    }, option=orjson.OPT_INDENT_2))
    dest.put_bytes(SUCCESS, b"")
    return rows
