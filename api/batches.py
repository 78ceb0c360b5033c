"""/v1/batches: create, retrieve, list, cancel."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g

from api import context
from api.idempotency import idempotent
from api.schemas import batch_object, json_body, page, page_params
from jobs import service
from jobs.repository import ShardSums
from jobs.requests import BatchCreate, parse_model

bp = Blueprint("batches", __name__)


@bp.post("/batches")
@idempotent
def create() -> Any:
    req = parse_model(BatchCreate, json_body())
    b = service.create_batch(context(), g.tenant_id, req, g.api_key_id)
    return batch_object(b, ShardSums())


@bp.get("/batches/<batch_id>")
def retrieve(batch_id: str) -> Any:
    return batch_object(*service.get_batch(context(), g.tenant_id, batch_id))


@bp.get("/batches")
def list_() -> Any:
    after, limit = page_params()
    rows, more = service.list_batches(context(), g.tenant_id, after, limit)
    return page([batch_object(b, sums) for b, sums in rows], more)


@bp.post("/batches/<batch_id>/cancel")
def cancel(batch_id: str) -> Any:
    service.cancel_batch(context(), g.tenant_id, batch_id)
    return batch_object(*service.get_batch(context(), g.tenant_id, batch_id))
