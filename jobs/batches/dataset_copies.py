"""A dataset batch's rows copied into shard objects, as an upload's are.

The path of the rows that cannot be views of their objects (jobs/batches/views.py):
JSONL rows, whose text is rendered and checked a row at a time, and chat rows holding
whole conversations (a ``messages`` column), each parsed as its own request. Each
object is read in its pinned version, a record batch at a time (JSONL lines gathered
``JSONL_ROWS`` at a time), and its rows go into the sharder's shards; custom_ids are
checked for repeats by hash once every row is in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from jobs.batches import outputs
from jobs.batches.dataset_columns import Ids, as_text, find_repeats, render
from jobs.batches.datasets import (
    READ_ROWS,
    Bad,
    Manifest,
    RowForm,
    changed,
    missing_columns,
    open_parquet,
)
from jobs.batches.sharding import MESSAGES_HINT, Sharder, json_messages
from jobs.core.errors import InvalidRequest, shown
from jobs.fleet.catalog import Catalog
from jobs.tenants.token_counts import prompt_tokens
from storage import datasets as ds
from storage.objects import buffered

JSONL_ROWS = 10_000  # JSONL rows gathered into one record batch


class _DatasetSharder:
    def __init__(self, s: Sharder, manifest: Manifest, defaults: dict[str, Any],
                 models: Catalog, max_line: int) -> None:
        self.s, self.m, self.endpoint, self.max_line = s, manifest, s.endpoint, max_line
        self.defaults = defaults
        self.messages = manifest.conversations
        self.form = RowForm.build(self.endpoint, defaults, manifest, models)
        self.ids = Ids()
        self.client = ds.s3_client() if manifest.files[0].uri.startswith("s3://") else None
        self.pieces = manifest.pieces
        self.columns = manifest.columns

    # Reading ---------------------------------------------------------------------------------

    def batches(self, obj: ds.SourceObject, columns: list[str]) -> Iterator[pa.RecordBatch]:
        if self.m.format == "parquet":
            f, pf = open_parquet(obj, self.client, columns)
            with f:
                yield from pf.iter_batches(batch_size=READ_ROWS, columns=columns)
        else:
            with ds.open_pinned(obj, self.client) as f:
                yield from self._jsonl(obj, f, columns)

    def _jsonl(self, obj: ds.SourceObject, f: Any, columns: list[str]
               ) -> Iterator[pa.RecordBatch]:
        rows: list[dict[str, Any]] = []
        present: set[str] = set()
        n = 0
        reader = buffered(f)
        while line := reader.readline(self.max_line + 1):
            n += 1
            if len(line) > self.max_line:
                raise Bad("line_too_long", f"line {n} of {shown(obj.uri, 200)} is longer "
                           f"than {self.max_line} bytes")
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise Bad("invalid_json_line", f"line {n} of {shown(obj.uri, 200)} is not "
                           f"valid JSON: {e}") from None
            if not isinstance(value, dict):
                raise Bad("invalid_json_line", f"line {n} of {shown(obj.uri, 200)} is not a "
                           "JSON object")
            present.update(c for c in columns if c in value)
            rows.append({c: value.get(c) for c in columns})
            if len(rows) >= JSONL_ROWS:
                yield self._table(rows, columns, present, obj, n)
                rows = []
        if rows:
            yield self._table(rows, columns, present, obj, n)

    def _table(self, rows: list[dict[str, Any]], columns: list[str], present: set[str],
               obj: ds.SourceObject, n: int) -> pa.RecordBatch:
        missing = [c for c in columns if c not in present]
        if missing:  # in none of the rows so far: a mapping that names no field
            raise Bad("invalid_dataset", missing_columns(obj, missing, sorted(present)))
        try:
            t = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise Bad("invalid_dataset", f"{shown(obj.uri, 200)}, lines up to {n}: a field "
                       f"mixes types ({shown(str(e), 200)})") from None
        return t.combine_chunks().to_batches()[0]

    # Rows ------------------------------------------------------------------------------------

    def run(self) -> None:
        s = self.s
        s.plan.model = self.defaults.get("model")
        line = 0
        for obj in self.m.files:
            for rb in self.batches(obj, self.columns):
                if s.plan.error_count >= 100 or s.plan.total > s.max_requests:
                    return
                self.rows(rb, line, obj)
                line += rb.num_rows
        for h_line, message in self._repeats():
            s.plan.fail("duplicate_custom_id", message, h_line, "input_dataset.id_column")

    def rows(self, rb: pa.RecordBatch, first: int, obj: ds.SourceObject) -> None:
        s, form = self.s, self.form
        ids = as_text(rb.column(self.m.id_column), f"the id column {shown(self.m.id_column)}")
        id_list = ids.to_pylist()
        self.ids.add(ids)
        if self.messages:
            return self._messages(rb, first, id_list)
        text = render(rb, self.pieces)
        texts = text.to_pylist()
        lens = pc.utf8_length(text).to_pylist()
        nbytes = pc.binary_length(text).to_pylist()
        param = ("input_dataset.template" if self.m.template is not None
                 else "input_dataset.input_column")
        plan = s.plan
        for i, cid in enumerate(id_list):
            n = first + i + 1
            if not cid:
                plan.fail("missing_custom_id", f"row {n}: the id column "
                          f"{shown(self.m.id_column)} is empty", n, "input_dataset.id_column")
                continue
            plan.total += 1
            if plan.total > s.max_requests:
                plan.fail("too_many_requests", f"a batch holds at most {s.max_requests} "
                          "requests", n)
                return
            t = texts[i]
            if not t:
                plan.invalid += 1
                s.invalid_lines.append(outputs.invalid_request_line(
                    cid, f"row {n}: the input is empty", "empty_input", param))
                continue
            if form.fast:
                body = form.body(t)
                plan.input_tokens += form.overhead + nbytes[i]
            else:
                try:
                    clean = form.parsed(t, self.m.system, None)
                except InvalidRequest as e:
                    plan.invalid += 1
                    s.invalid_lines.append(outputs.invalid_request_line(
                        cid, e.message, e.code or "invalid_request", e.param))
                    continue
                body = orjson.dumps(clean)
                plan.input_tokens += prompt_tokens(self.endpoint, clean)
            s.rows.append((n, cid, body.decode(), lens[i] + form.extra_len))
            if len(s.rows) >= s.shard_rows:
                s.flush()
        plan.exact_tokens = False

    def _messages(self, rb: pa.RecordBatch, first: int, id_list: list[Any]) -> None:
        """Chat rows holding their conversation (as an uploaded Parquet file's): each
        parsed as its own request."""
        column = self.columns[1]
        for i, (cid, value) in enumerate(zip(id_list, rb.column(column).to_pylist(),
                                             strict=True)):
            problem = None
            if isinstance(value, str | bytes):
                value = json_messages(value)
                if value is None:
                    problem = InvalidRequest(MESSAGES_HINT, param="messages",
                                             code="invalid_messages")
            self.s.seen.clear()  # repeats are found by hash, below
            self.s.add(first + i + 1, cid, {**self.defaults, "messages": value}, problem)

    def _repeats(self) -> list[tuple[int, str]]:
        return find_repeats(self.ids, (
            as_text(rb.column(0), "the id column") for obj in self.m.files
            for rb in self.batches(obj, [self.m.id_column])))


def shard_dataset(s: Sharder, manifest: Manifest, defaults: dict[str, Any],
                  models: Catalog, max_line: int) -> None:
    """Validate the manifest's rows into ``s``'s shards (whole-dataset problems are the
    plan's errors, with their row numbers counted across the objects in order)."""
    try:
        _DatasetSharder(s, manifest, defaults, models, max_line).run()
    except Bad as e:
        s.plan.fail(e.code, e.message, None, e.param)
    except ds.SourceChanged as e:
        s.plan.fail("source_changed", changed(e), None, "input_dataset.uri")
    except InvalidRequest as e:
        s.plan.fail(e.code or "invalid_request", e.message, None, e.param)
