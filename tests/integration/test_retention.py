"""Retention through the official SDK in strict response validation, against the app in
this process on a database and Redis DB of this module's own and the session's S3
server: ``expires_after`` on files, ``output_expires_after`` on batches, expired files
answered as deleted at once and their objects deleted by the janitor (a running batch's
input only once it has ended), webhook events and usage records pruned after their
retention, and every malformed expiry refused by name."""

from __future__ import annotations

import io
import time
from typing import Any

import httpx2
import openai
import pytest
from openai import OpenAI
from sqlalchemy import func, select, update

from jobs.batches import finalize, janitor, retention
from jobs.core.context import Context
from jobs.core.schema import Batch, File, IdempotencyKey, UsageRecord, new_id, now
from jobs.core.webhook_tables import WebhookDelivery, WebhookEvent
from storage import keys
from tests.helpers import api_error, emb_line, jsonl, world_sdk
from tests.integration.conftest import UPLOADS_MODEL

DAY = 86400


@pytest.fixture
def client(uploads_world: dict[str, Any]) -> OpenAI:
    return world_sdk(uploads_world)


@pytest.fixture
def ctx(uploads_world: dict[str, Any]) -> Context:
    c: Context = uploads_world["ctx"]
    return c


def upload(client: OpenAI, **kw: Any) -> Any:
    data = jsonl([emb_line(0, "a line", model=UPLOADS_MODEL)])
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch", **kw)


def expire_now(ctx: Context, file_id: str) -> None:
    """As if its expiry had passed."""
    with ctx.db.session() as s:
        s.execute(update(File).where(File.id == file_id).values(expires_at=now() - 1))


def object_of(ctx: Context, file_id: str) -> str:
    with ctx.db.session() as s:
        f = s.get(File, file_id)
        assert f is not None
        return f.object_key


def test_expires_after_on_a_file(client: OpenAI, ctx: Context) -> None:
    f = upload(client, expires_after={"anchor": "created_at", "seconds": 3600})
    assert f.expires_at == f.created_at + 3600
    assert upload(client).expires_at is None  # kept until deleted
    key = object_of(ctx, f.id)
    expire_now(ctx, f.id)
    # Gone at once: every route answers it as deleted, before the janitor has run.
    for call in (lambda: client.files.retrieve(f.id), lambda: client.files.content(f.id),
                 lambda: client.files.delete(f.id)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert api_error(e.value)["message"] == f"No such File object: {f.id}"
    assert f.id not in [x.id for x in client.files.list()]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    assert ctx.store.exists(key)
    assert f.id in janitor.sweep(ctx).pruned.files
    assert not ctx.store.exists(key)
    with ctx.db.session() as s:
        row = s.get(File, f.id)
        assert row is not None and row.deleted
    assert f.id not in retention.expire_files(ctx)  # once


def test_a_running_batchs_input_is_deleted_only_once_the_batch_ends(client: OpenAI,
                                                                   ctx: Context) -> None:
    f = upload(client, expires_after={"anchor": "created_at", "seconds": 3600})
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    key = object_of(ctx, f.id)
    expire_now(ctx, f.id)
    assert f.id not in retention.expire_files(ctx)
    assert ctx.store.exists(key)  # the batch may still read it
    with ctx.db.session() as s:
        s.execute(update(Batch).where(Batch.id == b.id).values(status="completed"))
    assert retention.expire_files(ctx) == [f.id]
    assert not ctx.store.exists(key)


def test_output_expires_after_dates_the_batchs_output_files(client: OpenAI,
                                                            ctx: Context) -> None:
    f = upload(client)
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h",
                              output_expires_after={"anchor": "created_at", "seconds": 7200})
    key = keys.file_object(new_id("file-"))
    ctx.store.put_stream(key, io.BytesIO(b'{"custom_id": "0"}\n'))
    part = keys.output_part(b.id, 0, 0, "ok", 1)  # what the output was assembled from
    ctx.store.put_stream(part, io.BytesIO(b'{"custom_id": "0"}\n'))
    with ctx.db.session() as s:
        batch = s.get(Batch, b.id)
        assert batch is not None and batch.output_expires_after == 7200
        out_id = finalize._output_file(s, batch, "output", "jsonl", (key, 19, 1))
        batch.output_file_id, batch.status = out_id, "completed"
    assert out_id is not None
    out = client.files.retrieve(out_id)
    assert out.expires_at == out.created_at + 7200
    partial = f"/batches/{b.id}/output"
    assert client.get(partial, cast_to=httpx2.Response,
                      options={"params": {"partial": "true"}}).status_code == 200
    expire_now(ctx, out_id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(out_id)
    with pytest.raises(openai.ConflictError) as e:  # nor read from its parts
        client.get(partial, cast_to=httpx2.Response, options={"params": {"partial": "true"}})
    assert api_error(e.value)["code"] == "results_expired"
    assert retention.expire_files(ctx) == [out_id]
    assert not ctx.store.exists(key) and not ctx.store.exists(part)


@pytest.mark.parametrize("given", [
    {"anchor": "created_at", "seconds": 3599},
    {"anchor": "created_at", "seconds": 30 * DAY + 1},
    {"anchor": "last_active_at", "seconds": 3600},
    {"seconds": 3600},
])
def test_malformed_expiries_are_refused_by_name(client: OpenAI, ctx: Context,
                                                given: dict[str, Any]) -> None:
    with ctx.db.session() as s:
        files = s.scalar(select(func.count()).select_from(File))
    with pytest.raises(openai.BadRequestError) as e:
        upload(client, expires_after=given)
    assert api_error(e.value)["param"] == "expires_after"
    f = upload(client)
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h", output_expires_after=given)  # type: ignore[arg-type]
    assert str(api_error(e.value)["param"]).startswith("output_expires_after")
    with ctx.db.session() as s:
        assert s.scalar(select(func.count()).select_from(File)) == files + 1  # only ``f``
        assert s.scalar(select(func.count()).select_from(Batch).where(
            Batch.input_file_id == f.id)) == 0


def test_an_unknown_form_field_is_refused_by_name(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        upload(client, extra_body={"chunking_strategy": "auto"})
    err = api_error(e.value)
    assert (err["code"], err["param"]) == ("unsupported_parameter", "chunking_strategy")


def test_old_webhook_events_and_usage_are_pruned(uploads_world: dict[str, Any],
                                                  ctx: Context) -> None:
    t = time.time()
    tenant = _tenant(ctx)
    old, pending, recent = (new_id("evt_") for _ in range(3))
    with ctx.db.session() as s:
        for eid, age in ((old, 31 * DAY), (pending, 31 * DAY), (recent, DAY)):
            s.add(WebhookEvent(id=eid, tenant_id=tenant, type="batch.completed",
                               subject_id="batch_x", body="{}", created_at=t - age))
        s.flush()
        for eid, status in ((old, "delivered"), (pending, "pending"), (recent, "delivered")):
            s.add(WebhookDelivery(id=new_id("wd_"), event_id=eid, tenant_id=tenant,
                                  url="https://example.test/", status=status,
                                  next_attempt_at=t, give_up_at=t, created_at=t))
        for src, age in (("rt:old", 400 * DAY), ("rt:new", DAY)):
            s.add(UsageRecord(source=f"{src}:{t}", tenant_id=tenant, kind="embeddings",
                              model=UPLOADS_MODEL, lane="realtime", created_at=t - age))
    pruned = retention.prune(ctx, at=t)
    with ctx.db.session() as s:
        left = set(s.scalars(select(WebhookEvent.id).where(
            WebhookEvent.id.in_([old, pending, recent]))))
        deliveries = s.scalar(select(func.count()).select_from(WebhookDelivery).where(
            WebhookDelivery.event_id == old))
    assert left == {pending, recent} and deliveries == 0 and pruned.events >= 1
    assert pruned.usage == 0  # usage is kept unless a retention is set
    kept = ctx.settings.model_copy(update={"usage_retention_days": 365.0})
    st, ctx.settings = ctx.settings, kept
    try:
        assert retention.prune(ctx, at=t).usage >= 1
    finally:
        ctx.settings = st
    with ctx.db.session() as s:
        sources = set(s.scalars(select(UsageRecord.source).where(
            UsageRecord.source.like(f"rt:%:{t}"))))
    assert sources == {f"rt:new:{t}"}


def test_old_idempotency_keys_are_forgotten(uploads_world: dict[str, Any], ctx: Context) -> None:
    client = world_sdk(uploads_world)
    data = jsonl([emb_line(0, "keyed", model=UPLOADS_MODEL)])

    def create() -> str:
        return str(client.files.create(file=("k.jsonl", io.BytesIO(data)), purpose="batch",
                                       extra_headers={"Idempotency-Key": "retention-k"}).id)

    first = create()
    assert create() == first  # replayed
    with ctx.db.session() as s:  # eight days later
        s.execute(update(IdempotencyKey).where(IdempotencyKey.key == "retention-k")
                  .values(created_at=now() - 8 * DAY))
    assert retention.prune(ctx).keys >= 1
    assert create() != first  # forgotten: a new file


def _tenant(ctx: Context) -> str:
    from jobs.core.schema import Tenant

    with ctx.db.session() as s:
        tid = s.scalar(select(Tenant.id).limit(1))
    assert tid is not None
    return tid
