"""Reruns of what failed, and a batch's merged results.

A batch that has ended can be rerun for its failed requests (``POST
/v1/batches/{id}/retry``): a child batch, linked by ``parent_batch_id``, of the
requests whose latest result is an error — the batch's own result, or that of the
rerun of it that ended last — optionally only those whose error code is one of
``error_codes``. The requests are read back from the batch's shards as they were
validated (its defaults applied), written as the child's input file (JSONL,
``<batch>_retry.jsonl``), and the child is an ordinary batch from then on: the same
endpoint, tier, metadata, callback and output expiry. A request refused at
validation is in no shard and is not rerun (the same body would be refused again).
A batch whose input file has expired or was deleted cannot be rerun (409
``results_expired``), nor one over a dataset in place that was rewritten or deleted
since the batch read it (409 ``source_changed``): its requests are no longer what it ran.
Without ``error_codes`` the requests whose error a rerun cannot fix
(``NOT_RERUN_BY_DEFAULT``: a prompt over the context, a request the engine refused as
invalid) are left out. A rerun in the family of a batch with an ``output_dataset``
holds that prefix while it runs and, when it ends, replaces its requests' rows there
by its results (jobs/batches/exports.py, ``write_rerun``).

Its merged results (``GET /v1/batches/{id}/merged_output``) hold each custom_id of
the batch once, with its latest result: the batch's own output and error lines,
each replaced by the line of a rerun that ended later, reruns of reruns included.
Reruns that have not ended do not count yet. A batch with a Parquet input gets
Parquet (the reruns' lines as its rows), any other JSONL.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import orjson
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from jobs.batches import exports, output_reservations, outputs, service
from jobs.batches import queries as repo
from jobs.batches.datasets import Manifest
from jobs.batches.views import read_shard
from jobs.core.context import Context
from jobs.core.errors import Conflict, InvalidRequest, NotFound
from jobs.core.schema import Batch, File, Shard
from jobs.core.status import TERMINAL
from jobs.protocol.batch import BatchCreate, ExpiresAfter
from storage import datasets as ds
from storage.objects import CHUNK, ObjectNotFound
from storage.parquet import read_rows, write_rows

SPOOL_BYTES = 8 * 1024**2  # a child's input beyond this spills to disk
# Error codes a rerun of the same request cannot fix: a rerun without error_codes
# leaves these requests out (naming the codes in error_codes reruns them anyway).
NOT_RERUN_BY_DEFAULT = frozenset({
    "context_length_exceeded",  # the prompt is over the model's context
    "invalid_request", "invalid_value", "invalid_type", "invalid_messages",
    "invalid_token_id", "unsupported_parameter", "array_above_max_length",
    "string_above_max_length", "uncomputable_input", "empty_input",
})


class BatchRetry(BaseModel):
    """The body of ``POST /v1/batches/{id}/retry`` (may be left out)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    error_codes: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None, min_length=1, max_length=100,
        description="rerun only the requests whose error has one of these codes")


def retry(ctx: Context, tenant_id: str, batch_id: str, error_codes: list[str] | None = None,
          api_key_id: str | None = None) -> Batch:
    """The child batch of ``batch_id``'s failed requests (see the module). Reruns in one
    family (a batch, its reruns, theirs) are made one at a time: a second waits for the
    first and is then refused while the first runs (``retry_running``)."""
    with ctx.db.session() as lock:  # held until the child exists
        root = _root(lock, tenant_id, batch_id)
        lock.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                     {"k": f"inferq-retry:{root}"})
        with ctx.db.session() as s:
            running = [b.id for b in _descendants(s, root) if b.status not in TERMINAL]
            if running:
                raise Conflict(f"batch {running[0]}, a rerun in the family of {batch_id}, has "
                               "not ended: wait for it (or cancel it) before rerunning again",
                               code="retry_running")
            parent, chain = _ended_chain(s, tenant_id, batch_id)
            shards = repo.shards_of(s, batch_id)
            s.expunge_all()
        return _rerun(ctx, tenant_id, parent, chain, shards, error_codes, api_key_id)


def _rerun(ctx: Context, tenant_id: str, parent: Batch, chain: list[Batch],
           shards: list[Shard], error_codes: list[str] | None,
           api_key_id: str | None) -> Batch:
    batch_id = parent.id
    codes = set(error_codes) if error_codes is not None else None
    wanted: set[str] = set()
    skipped: Counter[str] = Counter()
    for cid, code in _latest_errors(ctx, chain):
        if codes is not None and code not in codes:
            continue
        if codes is None and code in NOT_RERUN_BY_DEFAULT:
            skipped[code] += 1
        else:
            wanted.add(cid)
    if not wanted:
        why = ""
        if skipped:
            why = (": " + ", ".join(f"{n} failed with {c}" for c, n in skipped.most_common())
                   + ", which a rerun of the same request cannot fix; name the codes in "
                   "error_codes (inferq retry --error-code) to rerun them anyway")
        raise InvalidRequest(f"batch {batch_id} has no failed request to rerun"
                             + (f" with error code {', '.join(sorted(codes))}" if codes else "")
                             + why, param="error_codes" if codes else None,
                             code="nothing_to_retry")
    _file(ctx, parent, parent.input_file_id)  # its requests are read from its input
    output = _output_prefix(ctx, parent)  # where its results also land, if anywhere
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as spool:
        found = _write_requests(ctx, parent, shards, wanted, spool)
        if not found:
            raise InvalidRequest(
                f"the {len(wanted)} failed requests of batch {batch_id} were all refused at "
                "validation: their bodies must be fixed and submitted in a new batch",
                code="nothing_to_retry")
        spool.seek(0)
        f = service.create_file(ctx, tenant_id, f"{batch_id}_retry.jsonl", "batch", spool)
    expiry = (ExpiresAfter(anchor="created_at", seconds=parent.output_expires_after)
              if parent.output_expires_after else None)
    req = BatchCreate(input_file_id=f.id, endpoint=parent.endpoint,
                      completion_window=parent.completion_window,  # type: ignore[arg-type]
                      metadata=parent.metadata_,
                      service_tier=parent.service_tier,  # type: ignore[arg-type]
                      callback_url=parent.callback_url, output_expires_after=expiry)
    try:
        child = service.create_batch(ctx, tenant_id, req, api_key_id,
                                     parent_batch_id=batch_id)
    except Exception:
        service.delete_file(ctx, tenant_id, f.id)  # the input of no batch
        raise
    if output is not None:
        with ctx.db.session() as s, contextlib.suppress(Conflict):
            b = s.get(Batch, child.id)  # a batch made meanwhile: finalize's check stops it
            if b is not None:
                output_reservations.reserve(s, b, output)
    return child


def _output_prefix(ctx: Context, parent: Batch) -> str | None:
    """The output dataset of the family's root, if it has one: a rerun writes its
    results there (jobs/batches/exports.py, ``write_rerun``) and holds the prefix
    while it runs, as the batch that made the dataset did. 409 ``output_in_use`` when
    a batch that has not ended holds it (or a prefix overlapping it)."""
    with ctx.db.session() as s:
        b = s.get(Batch, parent.id)
        found = exports.output_of(s, ctx.store, exports.root_of(s, b)) if b else None
        if found is None:
            return None
        held = output_reservations.holder(s, found[1])
        if held is not None:
            who = f"batch {held[0]}" if held[1] == parent.tenant_id else "another project's batch"
            raise Conflict(f"the output dataset {found[1]} of batch {parent.id}'s family is "
                           f"held by {who}, which has not ended: a rerun writes its results "
                           "there; wait for that batch to end", param="output_dataset.uri",
                           code="output_in_use")
        return found[1]


def merged_output(ctx: Context, tenant_id: str, batch_id: str) -> tuple[str, Iterator[bytes]]:
    """The format (``jsonl`` | ``parquet``) and the blocks of ``batch_id``'s merged
    results (see the module): for a batch over a dataset, its id column under its own
    name, as in its output dataset."""
    with ctx.db.session() as s:
        parent, chain = _ended_chain(s, tenant_id, batch_id)
        f = s.get(File, parent.input_file_id)
        parquet = f is not None and f.format in ("parquet", "dataset")
        id_column = "custom_id"
        if f is not None and f.format == "dataset":
            id_column = Manifest.from_json(ctx.store.get_bytes(f.object_key)).id_column
        s.expunge_all()
    for b in chain:  # every file is there before a byte is sent
        for file_id in (b.output_file_id, b.error_file_id):
            _file(ctx, b, file_id)
    items = _merged(ctx, chain)
    if not parquet:
        return "jsonl", (outputs.dumps(line) + b"\n" for _, line in items)
    return "parquet", _parquet(parent.endpoint, items, id_column)


def _root(s: Session, tenant_id: str, batch_id: str) -> str:
    """The first batch of ``batch_id``'s family (the one the reruns started from)."""
    b = repo.get_batch(s, tenant_id, batch_id)
    if b is None:
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    while b.parent_batch_id is not None:
        up = repo.get_batch(s, tenant_id, b.parent_batch_id)
        if up is None:
            break
        b = up
    return b.id


def _descendants(s: Session, batch_id: str) -> list[Batch]:
    """Its reruns, their reruns, and so on."""
    found: list[Batch] = []
    frontier = [batch_id]
    while frontier:
        children = list(s.scalars(select(Batch).where(Batch.parent_batch_id.in_(frontier))))
        found += children
        frontier = [c.id for c in children]
    return found


def _ended_at(b: Batch) -> int:
    return max(t or 0 for t in (b.completed_at, b.failed_at, b.cancelled_at, b.expired_at))


def _ended_chain(s: Session, tenant_id: str, batch_id: str) -> tuple[Batch, list[Batch]]:
    """The batch, then its reruns that have ended (reruns of reruns too) in the order
    they ended: a later one's result replaces an earlier one's. 409 while the batch
    itself has not ended."""
    parent = repo.get_batch(s, tenant_id, batch_id)
    if parent is None:
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    if parent.status not in TERMINAL:
        raise Conflict(f"batch {batch_id} is {parent.status}: it can be rerun, and its "
                       "results merged, once it has ended", code="batch_not_ended")
    ended = [c for c in _descendants(s, batch_id) if c.status in TERMINAL]
    return parent, [parent, *sorted(ended, key=lambda c: (_ended_at(c), c.id))]


def _file(ctx: Context, b: Batch, file_id: str | None) -> File | None:
    if file_id is None:
        return None
    with ctx.db.session() as s:
        f = repo.get_file(s, b.tenant_id, file_id)
    if f is None:
        raise _gone(b.id, file_id)
    return f


def _gone(batch_id: str, file_id: str) -> Conflict:
    return Conflict(f"the results of batch {batch_id} are gone (its file {file_id} expired "
                    "or was deleted)", code="results_expired")


def _results(ctx: Context, b: Batch, file_id: str | None) -> Iterator[tuple[str, Any]]:
    """(custom_id, line or Parquet row) of one of a batch's result files."""
    f = _file(ctx, b, file_id)
    if f is None:
        return
    if f.format == "parquet":
        with ctx.store.open(f.object_key) as fh:
            rows = read_rows(io.BytesIO(fh.read()))
        for row in rows:
            yield str(row["custom_id"]), row
        return
    for line in outputs.iter_lines(ctx.store.iter_chunks(f.object_key, CHUNK)):
        yield str(line.get("custom_id")), line


def _code(item: dict[str, Any]) -> str | None:
    """The error code of an error line or row."""
    if "response" not in item:  # a Parquet row
        code = item.get("error_code")
        return code if isinstance(code, str) else None
    return outputs.error_code(item)


def _overrides(ctx: Context, chain: list[Batch]) -> list[set[str]]:
    """For each batch of the chain, the custom_ids a later one has a result for."""
    later: list[set[str]] = [set() for _ in chain]
    seen: set[str] = set()
    for i in range(len(chain) - 1, -1, -1):
        later[i] = set(seen)
        if i:  # the first (the batch itself) overrides nothing
            b = chain[i]
            for file_id in (b.output_file_id, b.error_file_id):
                seen.update(cid for cid, _ in _results(ctx, b, file_id))
    return later


def _latest_errors(ctx: Context, chain: list[Batch]) -> Iterator[tuple[str, str | None]]:
    """(custom_id, error code) of each request whose latest result is an error."""
    for b, later in zip(chain, _overrides(ctx, chain), strict=True):
        for cid, item in _results(ctx, b, b.error_file_id):
            if cid not in later:
                yield cid, _code(item)


def _merged(ctx: Context, chain: list[Batch]) -> Iterator[tuple[str, Any]]:
    for b, later in zip(chain, _overrides(ctx, chain), strict=True):
        for file_id in (b.output_file_id, b.error_file_id):
            for cid, item in _results(ctx, b, file_id):
                if cid not in later:
                    yield cid, item


def _write_requests(ctx: Context, parent: Batch, shards: list[Shard], wanted: set[str],
                    out: IO[bytes]) -> int:
    """The wanted requests of the batch's shards as batch input lines; how many."""
    n = 0
    for sh in shards:
        try:
            rows = read_shard(ctx.store, sh)
        except ObjectNotFound:  # the input expired: its shards went with it
            raise _gone(parent.id, parent.input_file_id) from None
        except ds.SourceChanged as e:  # a view of a dataset rewritten since
            raise Conflict(f"batch {parent.id} cannot be rerun: {e}, and a rerun reads its "
                           "requests from the dataset as the batch read it; submit a new "
                           "batch over the dataset as it is now", param="input_dataset.uri",
                           code="source_changed") from None
        for row in rows:
            if row["custom_id"] in wanted:
                out.write(orjson.dumps({"custom_id": row["custom_id"], "method": "POST",
                                        "url": parent.endpoint,
                                        "body": orjson.Fragment(row["body"])}) + b"\n")
                n += 1
    return n


def _parquet(endpoint: str, items: Iterator[tuple[str, Any]], id_column: str
             ) -> Iterator[bytes]:
    schema = outputs.parquet_schema(endpoint)
    if id_column != "custom_id":
        items = ((cid, {(id_column if k == "custom_id" else k): v for k, v in
                        (outputs.parquet_row(endpoint, item) if "response" in item
                         else item).items()}) for cid, item in items)
        schema = pa.schema([f.with_name(id_column) if f.name == "custom_id" else f
                            for f in schema])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "merged.parquet"
        write_rows(path, schema, (outputs.parquet_row(endpoint, item) if "response" in item
                                  else item for _, item in items))
        with path.open("rb") as fh:
            while block := fh.read(CHUNK):
                yield block
