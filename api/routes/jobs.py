"""/v1/jobs: one asynchronous request for any endpoint."""

from __future__ import annotations

from flask import g

from api.current import charge_limits, context
from api.idempotency import idempotent
from api.request_parsing import json_body
from api.routes.contract import Blueprint
from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.core import refs
from jobs.core.schema import new_id
from jobs.protocol.objects.jobs import JobObject
from jobs.protocol.validation import parse_model
from jobs.tenants import token_counts
from jobs.webhooks import endpoints

bp = Blueprint("jobs", __name__, access="project")


@bp.post("/jobs", body=asyncjobs.JobCreate, errors={429})
@idempotent
def create() -> tuple[JobObject, int]:
    req: asyncjobs.JobCreate = parse_model(asyncjobs.JobCreate, json_body())
    ctx = context()
    clean = asyncjobs.validate(ctx, req.endpoint, req.body)
    if req.callback_url is not None:
        endpoints.check_callback(ctx, g.tenant_id, req.callback_url)
    job_id = new_id("job_")  # its reservation is settled by id when the job completes
    charge_limits(refs.split_ref(clean["model"])[0], token_counts.request_tokens(
        req.endpoint, clean, ctx.settings.rate_limit_default_max_tokens), member=job_id)
    job = asyncjobs.store(ctx, g.tenant_id, req.endpoint, clean,
                          callback_url=req.callback_url, api_key_id=g.api_key_id,
                          job_id=job_id)
    return JobObject.of(job), 200


@bp.get("/jobs/<job_id>")
def retrieve(job_id: str) -> JobObject:
    return JobObject.of(asyncjobs.get(context(), g.tenant_id, job_id))
