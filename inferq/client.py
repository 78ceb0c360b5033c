"""Batches from a notebook: a data frame in, the same frame with result columns out.

    from inferq import client as iq

    vectors = iq.embed(df, column="text", model="all-MiniLM-L6-v2")
    labels = iq.chat(df, template="Classify this review: {title}\\n{body}",
                     model="SmolLM2-135M-Instruct", max_tokens=8)

``df`` is a pandas or polars DataFrame or a pyarrow Table; what comes back is of the
same kind: the input's rows, in their order, with the result columns added —
``embedding`` (embeddings), ``content`` and ``finish_reason`` (chat), and ``error``
(the error code of a request that failed, else null). The rows go to the service as
one Parquet batch input (``custom_id`` is the row's position, or ``id_column``'s
value), the progress is shown while the batch runs (rich: a terminal or Jupyter), and
the output and error files are read back and joined to the rows.

A restarted kernel loses nothing: running the same cell again sends the same
Idempotency-Key (a digest of the rows and the parameters), so the service answers
with the batch already made, running or ended with results, and the cell waits for
it instead of submitting again (one that ended with no results is submitted anew).
Result columns a frame already has are replaced. ``submit`` returns a :class:`Run` at
once; ``attach(batch_id)`` finds a batch again by its id.

A dataset where it lives (Parquet or JSONL objects on the deployment's S3 endpoint)
is read in place, nothing uploaded: ``dataset(uri, model, ...)`` makes the batch and
returns its :class:`Run`; ``run.table()`` waits and reads the results back (the
dataset's id column under its own name), and with ``output=`` they are also written
there as a Parquet dataset::

    run = iq.dataset("s3://lake/reviews/*.parquet", "SmolLM2-135M-Instruct",
                     id_column="review_id", template="Classify: {title}\n{body}",
                     max_tokens=8, output="s3://lake/labels/run-7/")
    labels = run.table()

It speaks only the public HTTP API, through the ``openai`` SDK: the API's URL and
key are the arguments, else ``INFERQ_API_URL`` and ``INFERQ_API_KEY``, else the
``inferq up`` of this machine's data dir.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

EMBEDDINGS, CHAT = "/v1/embeddings", "/v1/chat/completions"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
RESULT_COLUMNS = {EMBEDDINGS: ("embedding",), CHAT: ("content", "finish_reason")}
# Earlier batches of the same rows that ended with no results, skipped before giving up.
MAX_REPLAYS = 5


class BatchFailed(RuntimeError):
    """The batch ended without results for its rows (failed, expired or cancelled with
    nothing done); its id and errors are in the message."""


def connect(api_url: str | None = None, api_key: str | None = None) -> Any:
    """An ``openai.OpenAI`` for the API: the arguments, else ``INFERQ_API_URL`` and
    ``INFERQ_API_KEY``, else the ``inferq up`` of this machine's data dir."""
    from openai import OpenAI

    url = api_url or os.environ.get("INFERQ_API_URL")
    key = api_key or os.environ.get("INFERQ_API_KEY")
    if url is None or key is None:
        from cli.client import api_url as local_url
        from cli.client import connect as local
        from jobs.core.settings import Settings

        settings = Settings.from_env()
        if key is None:
            return local(settings, url, None)
        url = local_url(settings, url)
    return OpenAI(base_url=url, api_key=key, max_retries=2)


def embed(data: Any, column: str, model: str, *, dimensions: int | None = None,
          id_column: str | None = None, client: Any = None, progress: bool = True,
          service_tier: str = "default", poll_s: float = 1.0) -> Any:
    """``data`` with an ``embedding`` column: the embedding of each row's ``column``."""
    texts = _table(data).column(column)
    body: dict[str, Any] = {"model": model}
    if dimensions is not None:
        body["dimensions"] = dimensions
    run = submit(data, EMBEDDINGS, {"input": texts}, body, id_column=id_column,
                 client=client, service_tier=service_tier)
    return run.result(data, progress=progress, poll_s=poll_s)


def chat(data: Any, model: str, *, template: str | None = None, column: str | None = None,
         system: str | None = None, response_format: dict[str, Any] | None = None,
         max_tokens: int | None = None, temperature: float | None = None,
         id_column: str | None = None, client: Any = None, progress: bool = True,
         service_tier: str = "default", poll_s: float = 1.0, **params: Any) -> Any:
    """``data`` with ``content`` and ``finish_reason`` columns: the answer to each row's
    prompt — ``template`` filled with the row's columns (``str.format`` fields), or
    the text of ``column`` — after ``system``, if given. ``response_format``,
    ``max_tokens``, ``temperature`` and any other chat parameter apply to every row."""
    if (template is None) == (column is None):
        raise ValueError("give one of template= (filled with each row's columns) or "
                         "column= (the prompt's column)")
    table = _table(data)
    prompts = (table.column(column).to_pylist() if column is not None
               else [template.format_map(row) for row in table.to_pylist()])  # type: ignore[union-attr]
    head = [{"role": "system", "content": system}] if system is not None else []
    messages = [[*head, {"role": "user", "content": p}] for p in prompts]
    body = {"model": model, **params, **{k: v for k, v in (
        ("response_format", response_format), ("max_tokens", max_tokens),
        ("temperature", temperature)) if v is not None}}
    run = submit(data, CHAT, {"messages": pa.array([json.dumps(m) for m in messages])}, body,
                 id_column=id_column, client=client, service_tier=service_tier)
    return run.result(data, progress=progress, poll_s=poll_s)


def submit(data: Any, endpoint: str, columns: dict[str, Any], body: dict[str, Any], *,
           id_column: str | None = None, client: Any = None,
           service_tier: str = "default") -> Run:
    """Send the rows as one batch: ``columns`` (the endpoint's input column, one value
    per row) and ``body`` (the parameters of every request). Submitting the same rows
    and parameters again answers the same batch (its Idempotency-Key is their digest)."""
    client = client or connect()
    table = _table(data)
    ids = (pa.array([str(v) for v in table.column(id_column).to_pylist()])
           if id_column is not None else pa.array([str(i) for i in range(table.num_rows)]))
    if id_column is not None and len(set(ids.to_pylist())) != len(ids):
        raise ValueError(f"the values of {id_column!r} must be distinct: they identify the rows")
    buf = io.BytesIO()
    pq.write_table(pa.table({"custom_id": ids, **columns}), buf, compression="zstd")
    payload = buf.getvalue()
    digest = hashlib.sha256(payload)
    digest.update(json.dumps([endpoint, body, service_tier], sort_keys=True).encode())
    key = f"inferq-client-{digest.hexdigest()[:48]}"
    started = time.time()
    for attempt in range(MAX_REPLAYS + 1):
        k = key if attempt == 0 else f"{key}:{attempt}"
        f = client.files.create(file=("rows.parquet", payload), purpose="batch",
                                extra_headers={"Idempotency-Key": k + ":file"})
        b = client.batches.create(input_file_id=f.id, endpoint=endpoint,
                                  completion_window="24h",
                                  metadata={"source": "inferq.client"},
                                  extra_body={"body": body, "service_tier": service_tier},
                                  extra_headers={"Idempotency-Key": k})
        replayed = b.created_at < int(started) - 1
        if not (replayed and b.status in TERMINAL and b.output_file_id is None):
            break  # new, or an earlier one that is running or has results
        # An earlier run's batch that ended with no results: submit anew (next key).
    return Run(b.id, endpoint, client, id_column)


def dataset(uri: str, model: str, *, endpoint: str = CHAT, template: str | None = None,
            input_column: str | None = None, id_column: str | None = None,
            system: str | None = None, output: str | None = None, format: str | None = None,
            client: Any = None, service_tier: str = "default", **params: Any) -> Run:
    """A batch over the dataset at ``uri`` (an object, a prefix ending in ``/`` or a
    glob), read where it is: each row's input is ``input_column``'s text or
    ``template`` over its columns (``{column}`` fields), after ``system``;
    ``params`` (``max_tokens``, ``temperature``, ``response_format``, ...) apply to
    every row; ``output``: an empty prefix where the results are also written (see
    docs/API.md, Datasets in place). Returns at once; the same call again answers the
    same batch (its Idempotency-Key is a digest of the call)."""
    from openai import omit

    client = client or connect()
    source: dict[str, Any] = {"uri": uri, **{k: v for k, v in (
        ("format", format), ("id_column", id_column), ("input_column", input_column),
        ("template", template), ("system", system)) if v is not None}}
    fields: dict[str, Any] = {"input_dataset": source, "body": {"model": model, **params},
                              "service_tier": service_tier}
    if output is not None:
        fields["output_dataset"] = {"uri": output}
    digest = hashlib.sha256(json.dumps([endpoint, fields], sort_keys=True).encode())
    b = client.batches.create(input_file_id=omit, endpoint=endpoint, completion_window="24h",
                              metadata={"source": "inferq.client"}, extra_body=fields,
                              extra_headers={"Idempotency-Key":
                                             f"inferq-client-{digest.hexdigest()[:48]}"})
    return Run(b.id, endpoint, client, id_column, dataset_id=id_column or "custom_id")


def attach(batch_id: str, *, id_column: str | None = None, client: Any = None) -> Run:
    """The batch ``batch_id`` (made by ``submit``, ``embed`` or ``chat``) again."""
    client = client or connect()
    b = client.batches.retrieve(batch_id)
    return Run(b.id, b.endpoint, client, id_column)


@dataclass
class Run:
    """A submitted batch: ``wait`` for it, then ``result`` joins its results to the rows."""

    batch_id: str
    endpoint: str
    client: Any
    id_column: str | None = None
    dataset_id: str | None = None  # a batch over a dataset: the name of its id column

    def wait(self, progress: bool = True, poll_s: float = 1.0) -> Any:
        """Poll the batch until it ends (a progress bar while ``progress``); the batch."""
        if not progress:
            while (b := self.client.batches.retrieve(self.batch_id)).status not in TERMINAL:
                time.sleep(poll_s)
            return b
        from cli.client import batch_progress

        with batch_progress() as bar:
            task = bar.add_task(self.batch_id, total=None)
            while True:
                b = self.client.batches.retrieve(self.batch_id)
                rc = b.request_counts
                bar.update(task, total=(rc.total or None) if rc else None,
                           completed=(rc.completed + rc.failed) if rc else 0,
                           description=f"{self.batch_id} {b.status}")
                if b.status in TERMINAL:
                    return b
                time.sleep(poll_s)

    def table(self, progress: bool = True, poll_s: float = 1.0) -> pa.Table:
        """Once the batch ended, its results as one pyarrow Table (the output rows, then
        the error rows): a dataset's id column under its own name, else ``custom_id``."""
        b = self.wait(progress, poll_s)
        parts = [pq.read_table(io.BytesIO(self.client.files.content(file_id).content))
                 for file_id in (b.output_file_id, b.error_file_id) if file_id is not None]
        if not parts:
            errors = "; ".join(e.message or "" for e in (b.errors.data or [])) if b.errors else ""
            raise BatchFailed(f"batch {b.id} ended {b.status} with no results"
                              + (f": {errors}" if errors else ""))
        t = pa.concat_tables(parts, promote_options="permissive")
        name = self.dataset_id or "custom_id"
        return t.rename_columns([name if n == "custom_id" else n for n in t.column_names])

    def result(self, data: Any, progress: bool = True, poll_s: float = 1.0) -> Any:
        """``data`` (the rows submitted) with the result columns, once the batch ended."""
        b = self.wait(progress, poll_s)
        if b.output_file_id is None and b.error_file_id is None:
            errors = "; ".join(e.message or "" for e in (b.errors.data or [])) if b.errors else ""
            raise BatchFailed(f"batch {b.id} ended {b.status} with no results"
                              + (f": {errors}" if errors else ""))
        table = _table(data)
        # The error file, then the output file: a row's result comes after its error.
        results = pa.concat_tables(
            [pq.read_table(io.BytesIO(self.client.files.content(file_id).content))
             for file_id in (b.error_file_id, b.output_file_id) if file_id is not None],
            promote_options="permissive")
        where = {cid: i for i, cid in enumerate(results.column("custom_id").to_pylist())}
        ids = (table.column(self.id_column).to_pylist() if self.id_column is not None
               else range(table.num_rows))
        taken = results.take(pa.array([where.get(str(i)) for i in ids], type=pa.int64()))
        for name in RESULT_COLUMNS[self.endpoint]:
            table = _put(table, name, taken.column(name))
        missing = pc.is_null(taken.column("custom_id"))  # no line at all: never answered
        table = _put(table, "error", pc.if_else(
            missing, pa.scalar("no_result"), taken.column("error_code").cast(pa.string())))
        return _like(data, table)


def _put(table: pa.Table, name: str, column: Any) -> pa.Table:
    """``table`` with the column ``name``: replaced where it has one (a frame that went
    through ``embed`` and then ``chat``), else added."""
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, column) if i >= 0 else table.append_column(name, column)


def _table(data: Any) -> pa.Table:
    """A pandas or polars DataFrame, or a pyarrow Table, as a pyarrow Table."""
    if isinstance(data, pa.Table):
        return data
    kind = type(data).__module__.split(".")[0]
    if kind == "polars":
        return data.to_arrow()
    if kind == "pandas":
        return pa.Table.from_pandas(data, preserve_index=False)
    raise TypeError(f"expected a pandas or polars DataFrame or a pyarrow Table, got "
                    f"{type(data).__name__}")


def _like(data: Any, table: pa.Table) -> Any:
    """``table`` as the kind of frame ``data`` is (its index kept for pandas)."""
    kind = type(data).__module__.split(".")[0]
    if kind == "polars":
        import polars as pl

        return pl.from_arrow(table)
    if kind == "pandas":
        out = table.to_pandas()
        out.index = data.index
        return out
    return table
