"""Use cases of files and batches behind the HTTP API and the control tasks: validate
everything, write once, commit, and only then send the messages the commit made valid."""

from __future__ import annotations

import logging
from typing import IO

from sqlalchemy import insert, select

from jobs.batches import datasets, fairshare, lifecycle, output_reservations, views
from jobs.batches import queries as repo
from jobs.batches.sharding import TokenCounter, validate_and_shard
from jobs.core import refs
from jobs.core.context import Context
from jobs.core.errors import (
    Conflict,
    InferqError,
    InvalidRequest,
    NotFound,
    shown,
    transient,
)
from jobs.core.lanes import tier_of
from jobs.core.schema import Batch, File, Shard, new_id, now
from jobs.core.status import TERMINAL, BatchStatus
from jobs.fleet import catalog, registry
from jobs.protocol.batch import BatchCreate
from jobs.protocol.embeddings import no_dimensions
from jobs.protocol.endpoints import EMBEDDINGS
from jobs.tenants import batch_quota
from jobs.webhooks import endpoints
from storage import keys
from storage.objects import ObjectNotFound
from storage.parquet import is_parquet

log = logging.getLogger("inferq.service")

UPLOAD_PURPOSES = ("batch",)
WINDOW_SECONDS = {"24h": 24 * 3600}


def create_file(ctx: Context, tenant_id: str, filename: str, purpose: str,
                stream: IO[bytes], expires_after: int | None = None) -> File:
    """Stream an upload into the object store and record it; it expires
    ``expires_after`` seconds after it is made, if given."""
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"purpose must be one of: {', '.join(UPLOAD_PURPOSES)}",
                             param="purpose")
    head = stream.read(4)
    if not head:
        raise InvalidRequest("the uploaded file is empty", param="file", code="empty_file")
    stream.seek(0)
    file_id = new_id("file-")
    key = keys.file_object(file_id)
    size = ctx.store.put_stream(key, stream)
    t = now()
    f = File(id=file_id, tenant_id=tenant_id, filename=filename[:512] or "upload",
             purpose=purpose, format="parquet" if is_parquet(head) else "jsonl", bytes=size,
             object_key=key, created_at=t,
             expires_at=None if expires_after is None else t + expires_after)
    with ctx.db.session() as s:
        s.add(f)
    return f


def get_file(ctx: Context, tenant_id: str, file_id: str) -> File:
    with ctx.db.session() as s:
        f = repo.get_file(s, tenant_id, file_id)
    if f is None:
        raise NotFound(f"No such File object: {file_id}", param="file_id")
    return f


def list_files(ctx: Context, tenant_id: str, after: str | None, limit: int,
               purpose: str | None) -> tuple[list[File], bool]:
    extra = [repo.file_exists()] + ([File.purpose == purpose] if purpose else [])
    with ctx.db.session() as s:
        return repo.page(s, File, tenant_id, after, limit, extra)


def delete_file(ctx: Context, tenant_id: str, file_id: str) -> None:
    """Delete a file; refused (409 ``file_in_use``) while a batch that has not ended
    takes it as its input."""
    with ctx.db.session() as s:
        f = repo.get_file(s, tenant_id, file_id, lock=True)
        if f is None:
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        using = s.scalar(select(Batch.id).where(Batch.input_file_id == file_id,
                                                Batch.status.not_in(TERMINAL)).limit(1))
        if using is not None:
            raise Conflict(f"file {file_id} is the input of batch {using}, which has not "
                           "ended: cancel it or wait for it to end first", param="file_id",
                           code="file_in_use")
        f.deleted = True
        key = f.object_key
    ctx.store.delete(key)


def open_file_content(ctx: Context, tenant_id: str, file_id: str) -> tuple[File, IO[bytes]]:
    f = get_file(ctx, tenant_id, file_id)
    return f, ctx.store.open(f.object_key)


# Batches -------------------------------------------------------------------------------


def create_batch(ctx: Context, tenant_id: str, req: BatchCreate,
                 api_key_id: str | None = None, parent_batch_id: str | None = None) -> Batch:
    """Store the batch (with the key that created it: its usage is billed to it) and
    ask for its validation. A ``callback_url`` (inferq extension) also receives its
    terminal event."""
    if req.callback_url is not None:
        endpoints.check_callback(ctx, tenant_id, req.callback_url)
    dataset, output = None, None
    if req.input_dataset is not None:
        if "model" not in req.body:
            raise InvalidRequest('a dataset names no model: give the batch\'s body.model (e.g. '
                                 '"body": {"model": "all-MiniLM-L6-v2"}; --model in the CLI)',
                                 param="body.model", code="missing_model")
        if not isinstance(req.body["model"], str):
            raise InvalidRequest("body.model must be a string", param="body.model")
        catalog.cached(ctx).require(req.body["model"], req.endpoint, param="body.model",
                                    versions=True)
        dataset, output = datasets.create_input(ctx, tenant_id, req.endpoint,
                                                req.input_dataset, req.output_dataset, req.body)
    try:
        b = _store_batch(ctx, tenant_id, req, api_key_id, parent_batch_id, dataset, output)
    except InferqError:  # refused, nothing committed: its manifest is no one's
        if dataset is not None:
            ctx.store.delete(dataset.object_key)
        raise
    ctx.dispatcher.validate(b.id)
    return b


def _store_batch(ctx: Context, tenant_id: str, req: BatchCreate, api_key_id: str | None,
                 parent_batch_id: str | None, dataset: File | None, output: str | None
                 ) -> Batch:
    """The batch's row (and its dataset's input File, its output prefix reserved: one
    transaction)."""
    with ctx.db.session() as s:
        if dataset is not None:
            s.add(dataset)
            s.flush()
        f = repo.get_file(s, tenant_id, dataset.id if dataset else req.input_file_id or "",
                          lock=True)
        if f is None:
            raise NotFound(f"No such File object: {req.input_file_id}", param="input_file_id")
        if f.purpose != "batch":
            raise InvalidRequest(f"file {f.id} has purpose {f.purpose!r}; a batch input needs "
                                 "purpose 'batch'", param="input_file_id")
        if "model" in req.body:
            if not isinstance(req.body["model"], str):
                raise InvalidRequest("body.model must be a string", param="body.model")
            info = catalog.cached(ctx).require(req.body["model"], req.endpoint,
                                               param="body.model", versions=True)
            if (req.endpoint == EMBEDDINGS and "dimensions" in req.body
                    and not info.matryoshka):  # every line would fail
                raise no_dimensions(info.name, param="body.dimensions")
        elif f.format in ("parquet", "dataset"):
            raise InvalidRequest("a Parquet input names no model: give the batch's body.model "
                                 '(e.g. "body": {"model": "all-MiniLM-L6-v2"}; --model in the '
                                 "CLI)", param="body.model", code="missing_model")
        created = now()
        b = Batch(id=new_id("batch_"), tenant_id=tenant_id, api_key_id=api_key_id,
                  endpoint=req.endpoint,
                  input_file_id=f.id, completion_window=req.completion_window,
                  service_tier=tier_of(req.service_tier),
                  status=BatchStatus.VALIDATING, defaults=req.body, metadata_=req.metadata,
                  callback_url=req.callback_url, created_at=created,
                  expires_at=created + WINDOW_SECONDS[req.completion_window],
                  output_expires_after=(req.output_expires_after.seconds
                                        if req.output_expires_after else None),
                  parent_batch_id=parent_batch_id)
        s.add(b)
        if output is not None:
            s.flush()
            output_reservations.reserve(s, b, output)
    return b


def get_batch(ctx: Context, tenant_id: str, batch_id: str) -> tuple[Batch, repo.ShardSums]:
    with ctx.db.session() as s:
        b = repo.get_batch(s, tenant_id, batch_id)
        if b is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return b, repo.shard_sums(s, [b.id]).get(b.id, repo.ShardSums())


def list_batches(ctx: Context, tenant_id: str, after: str | None, limit: int
                 ) -> tuple[list[tuple[Batch, repo.ShardSums]], bool]:
    with ctx.db.session() as s:
        rows, more = repo.page(s, Batch, tenant_id, after, limit)
        sums = repo.shard_sums(s, [b.id for b in rows])
    return [(b, sums.get(b.id, repo.ShardSums())) for b in rows], more


def cancel_batch(ctx: Context, tenant_id: str, batch_id: str) -> Batch:
    finalize = False
    with ctx.db.session() as s:
        b = repo.get_batch(s, tenant_id, batch_id, lock=True)
        if b is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        if b.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return b
        if b.status not in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
            raise Conflict(f"Cannot cancel a batch with status {b.status!r}", param="batch_id")
        was = b.status
        lifecycle.move(ctx, s, b, BatchStatus.CANCELLING)
        if was == BatchStatus.IN_PROGRESS:
            repo.cancel_queued_shards(s, b.id)
            s.flush()
            finalize = repo.unfinished_shards(s, b.id) == 0
    if finalize:
        ctx.dispatcher.finalize(batch_id)
    return b


# Control: validation and sharding ---------------------------------------------------------


def validate_batch(ctx: Context, batch_id: str, count_tokens: TokenCounter | None = None
                   ) -> None:
    """Control task body: validate + shard the input, then queue the shards.

    ``count_tokens``: the prompt tokens of each valid request, counted with the
    model's tokenizer (the control worker passes workers.models.token_count's); the
    batch's input tokens are their upper bound without it.

    A failure that trying again would only repeat (as opposed to a backend briefly
    unreachable, which the task retries) fails the batch, once, with the reason."""
    try:
        _validate(ctx, batch_id, count_tokens)
    except Exception as e:
        if transient(e) or not _fail_validation(ctx, batch_id, e):
            raise
        log.exception("batch %s: validation failed", batch_id)


def _fail_validation(ctx: Context, batch_id: str, e: Exception) -> bool:
    """End a batch whose validation failed; False if it had got past validation."""
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, batch_id, lock=True)
        if b is None or b.status not in (BatchStatus.VALIDATING, BatchStatus.CANCELLING):
            return False
        if b.status == BatchStatus.CANCELLING:
            lifecycle.move(ctx, s, b, BatchStatus.CANCELLED)
        else:
            lifecycle.move(ctx, s, b, BatchStatus.FAILED, errors=[{
                "code": "validation_failed", "line": None, "param": None,
                "message": f"the input file could not be validated ({_told(e)})"}])
    try:  # shards it may have written
        ctx.store.delete_prefix(keys.batch_prefix(batch_id))
    except Exception:  # noqa: BLE001 - the batch has ended; its objects are only left over
        log.exception("batch %s: could not delete its objects", batch_id)
    return True


def _told(e: Exception) -> str:
    """Why validation failed, as a client may read it: never the service's object keys
    or object-store replies (those go to the control worker's log)."""
    if isinstance(e, ObjectNotFound):
        return "its content is no longer in the object store"
    if type(e).__module__.split(".")[0] in ("botocore", "boto3", "s3transfer"):
        return f"the object store failed: {type(e).__name__}"
    return f"{type(e).__name__}: {shown(e, 300)}"


def _validate(ctx: Context, batch_id: str, count_tokens: TokenCounter | None) -> None:
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, batch_id)
        if b is None or b.status != BatchStatus.VALIDATING:
            if b is not None and b.status == BatchStatus.CANCELLING:
                _mark_cancelled_before_start(ctx, batch_id)
            return
        f = s.get(File, b.input_file_id)
        assert f is not None
        endpoint, defaults, file_key, fmt = b.endpoint, dict(b.defaults), f.object_key, f.format
    st = ctx.settings
    models = catalog.load(ctx)
    plan = validate_and_shard(
        ctx.store, batch_id=batch_id, file_key=file_key, file_format=fmt, endpoint=endpoint,
        defaults=defaults, shard_rows=st.shard_rows, max_line=st.max_line_bytes,
        max_inputs=st.max_embedding_inputs, max_requests=st.max_requests_per_batch,
        models=models, count_tokens=count_tokens,
        read_dataset=views.reader(defaults, models, st.max_line_bytes))
    # a batch runs on the version its lines name (name@version), else on its model's
    # default version now: it keeps that version to the end
    model, pinned = refs.split_ref(plan.model) if plan.model else (None, None)
    if model is not None and pinned is None:
        default = registry.get_default(ctx, model)
        pinned = default.version if default is not None else None
    shard_ids: list[str] = []
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, batch_id, lock=True)
        assert b is not None
        if b.status not in (BatchStatus.VALIDATING, BatchStatus.CANCELLING):
            return  # a concurrent delivery of this task got here first
        if b.status == BatchStatus.CANCELLING:
            lifecycle.move(ctx, s, b, BatchStatus.CANCELLED)
            ctx.store.delete_prefix(keys.batch_prefix(batch_id))
            return
        if plan.errors:
            lifecycle.move(ctx, s, b, BatchStatus.FAILED, errors=plan.errors)
            return
        over = batch_quota.batch_token_error(ctx, s, b.tenant_id, model, plan.input_tokens,
                                        exact=plan.exact_tokens)
        if over is not None:  # past the project's batch input tokens of the day
            lifecycle.move(ctx, s, b, BatchStatus.FAILED, errors=[over])
            ctx.store.delete_prefix(keys.batch_prefix(batch_id))
            return
        b.total, b.invalid, b.model = plan.total, plan.invalid, model
        b.model_version = pinned
        b.input_tokens = plan.input_tokens
        lifecycle.move(ctx, s, b, BatchStatus.IN_PROGRESS)
        sent_at = fairshare.new_shards_dispatched_at(ctx)  # None: waiting for their turn
        new_shards = []
        for index, rows in enumerate(plan.shards):
            sid = refs.shard_id(batch_id, index)
            view = plan.views[index] if plan.views else None
            new_shards.append({
                "id": sid, "batch_id": batch_id, "index": index, "rows": rows,
                "object_key": file_key if view else keys.shard_input(batch_id, index),
                "source": view, "dispatched_at": sent_at})
            shard_ids.append(sid)
        if new_shards:  # one INSERT of many rows: a dataset has thousands of shards
            s.execute(insert(Shard), new_shards)
        tier = b.service_tier
    if shard_ids:
        fairshare.after_validation(ctx, shard_ids, tier)
    else:
        ctx.dispatcher.finalize(batch_id)


def _mark_cancelled_before_start(ctx: Context, batch_id: str) -> None:
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, batch_id, lock=True)
        if b is not None and b.status == BatchStatus.CANCELLING:
            lifecycle.move(ctx, s, b, BatchStatus.CANCELLED)
