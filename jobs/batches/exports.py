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

The prefix is the batch's alone (jobs/batches/output_reservations.py), and the writer
makes sure of it: before it writes a part, and again before ``_manifest.json`` and
``_SUCCESS``, the prefix may hold only what this batch writes (its parts, each
carrying the batch's id in its Parquet metadata, and its own manifest). Anything else
(another run's ``part-*``, a file someone put there) is never overwritten nor deleted:
the batch fails (``finalize_failed``, naming the objects) and the dataset is not
marked complete.

A rerun (jobs/batches/retry.py) writes its results into the dataset of the batch its
family started from (the root, whose prefix it reserves while it runs): when it is
finalized, ``write_rerun`` replaces, in the root's parts, the rows of the requests
it ran by its own results (in their places, under the dataset's id column), then
writes a new ``_manifest.json`` (``reruns``: the reruns applied, in order) and
``_SUCCESS`` again, which it removes first: a reader that sees ``_SUCCESS`` sees one
consistent table. The parts keep the root's id (the dataset stays the root's: a later
rerun, or a finalize that runs again, may write it again) and also carry the rerun's
(``inferq.rerun_batch_id``). The same ownership rule holds: the prefix may hold only
the root's manifest and the parts it lists, each carrying the root's id; anything
else fails the rerun (``finalize_failed``) and nothing is written.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from jobs.batches import done_rows, outputs
from jobs.batches import queries as repo
from jobs.batches.datasets import Manifest
from jobs.core.schema import Batch, File, Shard, now
from jobs.core.status import ShardStatus
from storage import datasets as ds
from storage import keys
from storage.objects import CHUNK, ObjectNotFound, ObjectStore

SUCCESS = "_SUCCESS"
MANIFEST = "_manifest.json"
BATCH_KEY = b"inferq.batch_id"  # the Parquet metadata key of a part's batch
RERUN_KEY = b"inferq.rerun_batch_id"  # ... and of the rerun that last rewrote it


class NotOwned(Exception):
    """The output prefix holds objects the batch did not write."""


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
    rows = done_rows.unrun(store, sh)
    yield b"".join(outputs.unrun_line(r["custom_id"], code, message) for r in rows)


def _table(endpoint: str, id_column: str, lines: Iterator[bytes]) -> pa.Table:
    schema = outputs.parquet_schema(endpoint)
    rows = [outputs.parquet_row(endpoint, line) for line in outputs.iter_lines(lines)]
    t = pa.Table.from_pylist(rows, schema=schema)
    if id_column != "custom_id":
        t = t.rename_columns([id_column if n == "custom_id" else n for n in t.column_names])
    return t


def _put(dest: ObjectStore, b: Batch, name: str, t: pa.Table,
         rerun: str | None = None) -> dict[str, Any]:
    buf = io.BytesIO()
    t = t.replace_schema_metadata({**(t.schema.metadata or {}), BATCH_KEY: b.id.encode(),
                                   **({RERUN_KEY: rerun.encode()} if rerun else {})})
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
    part_names = ({"part-validation.parquet"} if invalid else set()) | {
        f"part-{sh.index:06d}.parquet" for sh in shards}
    _own(dest, b, manifest.output, part_names, written=set())
    if invalid:
        parts.append(_put(dest, b, "part-validation.parquet",
                          _table(b.endpoint, manifest.id_column, iter([invalid]))))
    for sh in shards:
        t = _table(b.endpoint, manifest.id_column, _shard_lines(store, b, sh, reason))
        parts.append(_put(dest, b, f"part-{sh.index:06d}.parquet", t))
    _own(dest, b, manifest.output, part_names, written=part_names)
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


def _own(dest: ObjectStore, b: Batch, uri: str, names: set[str], written: set[str]) -> None:
    """NotOwned unless the prefix holds only ``names`` (``written``: by this run; the
    others must be parts of this batch, from a finalize that ran before) and this
    batch's ``_manifest.json`` and ``_SUCCESS``."""
    found = dest.list("")
    mine = MANIFEST in found and _manifest_batch(dest) == b.id
    foreign = [k for k in found
               if not (k in written or (k in names and _part_batch(dest, k) == b.id)
                       or (k in (MANIFEST, SUCCESS) and mine))]
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more"
                                            if len(foreign) > 5 else "")
        raise NotOwned(f"the output prefix {uri} holds objects this batch did not write "
                       f"({listed}): they were left as they are, and the output dataset was "
                       "not marked complete")


def _manifest_batch(dest: ObjectStore) -> str | None:
    try:
        value = orjson.loads(dest.get_bytes(MANIFEST)).get("batch_id")
    except (ObjectNotFound, orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _part_batch(dest: ObjectStore, key: str) -> str | None:
    """The batch a part says it belongs to (None: not one of ours, or not Parquet)."""
    try:
        meta = pq.read_schema(io.BytesIO(dest.get_bytes(key))).metadata or {}
    except (ObjectNotFound, OSError, ValueError, pa.ArrowException):
        return None
    value = meta.get(BATCH_KEY)
    return value.decode(errors="replace") if value is not None else None


def root_of(s: Session, b: Batch) -> Batch:
    """The batch ``b``'s family started from (``b`` itself unless it is a rerun)."""
    while b.parent_batch_id is not None:
        up = repo.get_batch(s, None, b.parent_batch_id)
        if up is None:
            break
        b = up
    return b


def output_of(s: Session, store: ObjectStore, b: Batch) -> tuple[Manifest, str] | None:
    """The input manifest and output prefix of a batch over a dataset with an
    ``output_dataset``; None for any other batch."""
    f = s.get(File, b.input_file_id)
    if f is None or f.format != "dataset":
        return None
    manifest = Manifest.from_json(store.get_bytes(f.object_key))
    return None if manifest.output is None else (manifest, manifest.output)


def write_rerun(store: ObjectStore, s: Session, child: Batch, result_keys: list[str]) -> int:
    """Apply the rerun ``child``'s results (its output and error files, ``result_keys``)
    to the output dataset of its family's root, if it has one (see the module); the
    number of rows replaced."""
    root = root_of(s, child)
    found = output_of(s, store, root) if root.id != child.id else None
    if found is None:
        return 0
    manifest, uri = found
    dest = ds.destination(ds.parse(uri))
    try:
        current = orjson.loads(dest.get_bytes(MANIFEST))
    except (ObjectNotFound, orjson.JSONDecodeError):
        current = None
    if not isinstance(current, dict) or current.get("batch_id") != root.id:
        raise NotOwned(f"the output prefix {uri} holds no manifest of batch {root.id}, "
                       "whose rerun this is: the rerun's results were not written there")
    parts = current.get("parts") or []
    _own(dest, root, uri, {p["path"] for p in parts}, written=set())
    name = manifest.id_column
    new = _table(child.endpoint, name, (blk for key in result_keys
                                        for blk in store.iter_chunks(key, CHUNK)))
    if not new.num_rows:
        return 0
    dest.delete(SUCCESS)  # until the manifest says what the parts hold
    replaced, written = 0, []
    for p in parts:
        t = pq.read_table(io.BytesIO(dest.get_bytes(p["path"]))).replace_schema_metadata(None)
        at = pc.index_in(t.column(name), value_set=new.column(name))
        hits = len(at) - at.null_count
        if hits:
            rows = pc.if_else(pc.is_null(at), pa.array(range(t.num_rows), pa.int64()),
                              pc.add(at.cast(pa.int64()), t.num_rows))
            t = pa.concat_tables([t, new.cast(t.schema)]).take(rows)
            p = _put(dest, root, p["path"], t, rerun=child.id)
            replaced += hits
        written.append(p)
    reruns = [r for r in current.get("reruns") or [] if r != child.id] + [child.id]
    dest.put_bytes(MANIFEST, orjson.dumps({
        **current, "parts": written, "rows": sum(p["rows"] for p in written),
        "reruns": reruns, "updated_at": now()}, option=orjson.OPT_INDENT_2))
    dest.put_bytes(SUCCESS, b"")
    return replaced
