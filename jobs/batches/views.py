"""Shards that are views of a Parquet dataset in place: nothing is copied.

A batch over Parquet objects whose rows are texts (an input column or a template) is
validated column by column: each record batch's ids and rendered inputs are checked
with Arrow kernels (no row is touched one by one but to hash its id), and its shards
are ranges of rows of one row group of one object — ``Shard.source``: the object's
index in the manifest, the row group, the range, the first row's number — with no
object of their own. A worker reads its shard's range in the pinned version of the
object (``read_shard``) and renders the rows again exactly as validation did: the same
code over the same bytes, so the rows validation counted are the rows that run, in
the same order (by length, as every shard). Rows refused at validation (an empty
input) are left out of the view's rows and have their error lines already.

A view holds up to ``shard_rows`` rows, or a sixteenth of its row group when that is
more: a worker decodes its row group up to the view's end, so a large row group is
cut into at most 16 views rather than read a hundred times.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.batches import outputs
from jobs.batches.dataset_columns import Ids, as_text, find_repeats, render, text_hashes
from jobs.batches.dataset_copies import shard_dataset
from jobs.batches.datasets import READ_ROWS, Bad, Manifest, RowForm, changed, open_parquet
from jobs.batches.sharding import DatasetReader, Sharder
from jobs.core.errors import InvalidRequest, shown
from jobs.core.schema import Shard
from jobs.fleet.catalog import Catalog
from storage import datasets as ds
from storage.objects import ObjectStore
from storage.parquet import read_rows

VIEWS_PER_ROW_GROUP = 16
# Objects read at once: one a core (more contend for the GIL's share of the work).
FILES_IN_FLIGHT = min(8, os.cpu_count() or 2)


def viewable(manifest: Manifest, form: RowForm) -> bool:
    """Whether the batch's shards can be views: Parquet rows of text, whose request
    bodies the form builds without parsing each one."""
    return manifest.format == "parquet" and not manifest.conversations and form.fast


def _texts(manifest: Manifest, rb: pa.RecordBatch) -> tuple[pa.Array, pa.Array, np.ndarray,
                                                           np.ndarray]:
    """A record batch's ids and rendered inputs, which rows lack an id, and each
    input's UTF-8 bytes (0: empty)."""
    ids = as_text(rb.column(manifest.id_column), f"the id column {shown(manifest.id_column)}")
    no_id = pc.fill_null(pc.equal(pc.binary_length(ids), 0), True).to_numpy(
        zero_copy_only=False)
    text = render(rb, manifest.pieces)
    nbytes = pc.fill_null(pc.binary_length(text), 0).to_numpy(zero_copy_only=False)
    return ids, text, no_id, nbytes


@dataclass
class _FileResult:
    """What one object's rows gave; row numbers are the object's own (from 0)."""

    rows: int = 0
    views: list[dict[str, Any]] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    no_id: list[int] = field(default_factory=list)  # rows without an id (at most 100)
    empty: list[tuple[int, str]] = field(default_factory=list)  # (row, id): no input
    total: int = 0
    tokens: int = 0
    hashes: list[np.ndarray] = field(default_factory=list)


class ViewSharder:
    """Validation of a viewable dataset into ``s``'s plan (views, counts, errors). Up
    to ``FILES_IN_FLIGHT`` objects are read at once (Arrow's kernels and the hashes
    run without the GIL); their results are merged in the manifest's order."""

    def __init__(self, s: Sharder, manifest: Manifest, form: RowForm) -> None:
        self.s, self.m, self.form = s, manifest, form
        self.client = ds.s3_client() if manifest.files[0].uri.startswith("s3://") else None
        self.param = ("input_dataset.template" if manifest.template is not None
                      else "input_dataset.input_column")

    def run(self) -> None:
        s, m, plan = self.s, self.m, self.s.plan
        plan.model = m.defaults.get("model")
        ids = Ids()
        line = 0  # rows of the objects before this one
        with ThreadPoolExecutor(FILES_IN_FLIGHT, thread_name_prefix="dataset-read") as pool:
            for fi, res in enumerate(pool.map(self.file, range(len(m.files)))):
                for row in res.no_id:
                    plan.fail("missing_custom_id", f"row {line + row + 1}: the id column "
                              f"{shown(m.id_column)} is empty", line + row + 1,
                              "input_dataset.id_column")
                for row, cid in res.empty:
                    s.invalid_lines.append(outputs.invalid_request_line(
                        cid, f"row {line + row + 1}: the input is empty", "empty_input",
                        self.param))
                for view, count in zip(res.views, res.counts, strict=True):
                    plan.views.append({**view, "file": fi, "line": line + view["line"]})
                    plan.shards.append(count)
                plan.total += res.total
                plan.invalid += len(res.empty)
                plan.input_tokens += res.tokens
                ids.chunks.extend(res.hashes)
                line += res.rows
        plan.exact_tokens = False
        if plan.total > s.max_requests:
            plan.fail("too_many_requests", f"a batch holds at most {s.max_requests} requests",
                      None)
        if plan.error_count:
            return
        for at, message in find_repeats(ids, self._id_columns()):
            plan.fail("duplicate_custom_id", message, at, "input_dataset.id_column")

    def file(self, fi: int) -> _FileResult:
        m, out = self.m, _FileResult()
        f, pf = open_parquet(m.files[fi], self.client, m.columns)
        with f:
            for g in range(pf.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                size = max(self.s.shard_rows, math.ceil(n / VIEWS_PER_ROW_GROUP))
                counts = np.zeros(max(1, math.ceil(n / size)), np.int64)
                off = 0
                for rb in pf.iter_batches(batch_size=READ_ROWS, row_groups=[g],
                                          columns=m.columns, use_threads=False):
                    valid = self.check(rb, out.rows + off, out)
                    rows = np.flatnonzero(valid) + off
                    counts += np.bincount(rows // size, minlength=len(counts))
                    off += rb.num_rows
                for k, c in enumerate(counts.tolist()):
                    if c:
                        out.views.append({"row_group": g, "start": k * size,
                                          "count": min(size, n - k * size),
                                          "line": out.rows + k * size + 1})
                        out.counts.append(c)
                out.rows += n
        return out

    def check(self, rb: pa.RecordBatch, first: int, out: _FileResult) -> np.ndarray:
        """A record batch's checks and counts; which of its rows become requests."""
        ids, text, no_id, nbytes = _texts(self.m, rb)
        out.hashes.append(text_hashes(ids))
        if no_id.any() and len(out.no_id) < 100:
            out.no_id.extend((first + np.flatnonzero(no_id)[:100]).tolist())
        empty = (nbytes == 0) & ~no_id
        if empty.any():
            at = np.flatnonzero(empty)
            out.empty.extend(zip((first + at).tolist(), ids.take(pa.array(at)).to_pylist(),
                                 strict=True))
        valid = ~no_id & ~empty
        out.total += int((~no_id).sum())
        out.tokens += int(valid.sum()) * self.form.overhead + int(nbytes[valid].sum())
        return valid

    def _id_columns(self) -> Iterator[pa.Array]:
        for obj in self.m.files:
            f, pf = open_parquet(obj, self.client, [self.m.id_column])
            with f:
                for rb in pf.iter_batches(batch_size=READ_ROWS, columns=[self.m.id_column]):
                    yield as_text(rb.column(0), "the id column")


@lru_cache(maxsize=64)
def _manifest(store: ObjectStore, key: str) -> tuple[Manifest, RowForm]:
    m = Manifest.from_json(store.get_bytes(key))
    return m, RowForm.build(m.endpoint, m.defaults, m, None)


def view_rows(store: ObjectStore, sh: Shard) -> list[dict[str, Any]]:
    """A view's requests as a shard object holds them (line, custom_id, body, length),
    sorted as one is."""
    m, form = _manifest(store, sh.object_key)
    v = sh.source
    assert v is not None
    start, count = v["start"], v["count"]
    f, pf = open_parquet(m.files[v["file"]], None, m.columns)
    parts: list[pa.RecordBatch] = []
    with f:
        off = 0
        for rb in pf.iter_batches(batch_size=READ_ROWS, row_groups=[v["row_group"]],
                                  columns=m.columns):
            lo, hi = max(start - off, 0), min(start + count - off, rb.num_rows)
            if lo < hi:
                parts.append(rb.slice(lo, hi - lo))
            off += rb.num_rows
            if off >= start + count:
                break
    rows: list[tuple[int, str, str, int]] = []
    line = v["line"]
    for rb in parts:
        ids, text, no_id, nbytes = _texts(m, rb)
        lens = pc.utf8_length(text).to_pylist()
        for i, (cid, t) in enumerate(zip(ids.to_pylist(), text.to_pylist(), strict=True)):
            if not no_id[i] and nbytes[i]:
                rows.append((line + i, cid, form.body(t).decode(), lens[i] + form.extra_len))
        line += rb.num_rows
    rows.sort(key=lambda r: r[3])  # stable: as storage.parquet.shard_bytes sorts
    return [{"line": r[0], "custom_id": r[1], "body": r[2], "length": r[3]} for r in rows]


def read_shard(store: ObjectStore, sh: Shard, start: int = 0) -> list[dict[str, Any]]:
    """A shard's requests from position ``start`` (a view's read from its dataset)."""
    if sh.source is not None:
        return view_rows(store, sh)[start:]
    with store.open(sh.object_key) as f:
        return read_rows(io.BytesIO(f.read()), start=start)


def reader(defaults: dict[str, Any], models: Catalog, max_line: int) -> DatasetReader:
    """The sharding's reader of a dataset batch's input File (its manifest): views
    where the dataset allows them, shard objects otherwise (jobs/batches/dataset_copies.py)."""
    def read(s: Sharder, data: bytes) -> None:
        manifest = Manifest.from_json(data)
        try:
            form = RowForm.build(manifest.endpoint, defaults, manifest, models)
            if viewable(manifest, form):
                ViewSharder(s, manifest, form).run()
                return
        except Bad as e:
            s.plan.fail(e.code, e.message, None, e.param)
            return
        except ds.SourceChanged as e:
            s.plan.fail("source_changed", changed(e), None, "input_dataset.uri")
            return
        except InvalidRequest as e:
            s.plan.fail(e.code or "invalid_request", e.message, None, e.param)
            return
        shard_dataset(s, manifest, defaults, models, max_line)
    return read
