"""The batch quota: a project's batch input tokens per model in the last day
(``batch_1_day_max_input_tokens``), checked as a batch goes in progress."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.core.context import Context
from jobs.core.schema import Batch, Tenant
from jobs.tenants.limits import limits_for
from jobs.tenants.rate_windows import DAY_MS


def batch_token_error(ctx: Context, s: Session, tenant_id: str, model: str | None,
                      tokens: int, exact: bool = False) -> dict[str, Any] | None:
    """The error that fails a batch whose ``tokens`` (its input's prompt tokens: counted
    by the model's tokenizer when ``exact``, else an upper bound) would push
    the project's batch input tokens for ``model`` in the last day (batches that went
    in progress since) past ``batch_1_day_max_input_tokens``; None when it fits. Takes
    the project's row lock, so concurrent validations of one project are decided one
    after the other: call it in the transaction that moves the batch to in_progress."""
    if model is None:
        return None
    limit = limits_for(ctx, tenant_id, model, ttl_s=0).batch_day_input_tokens
    if limit <= 0:
        return None
    s.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
    since = int(time.time()) - DAY_MS // 1000
    used = s.scalar(select(func.coalesce(func.sum(Batch.input_tokens), 0)).where(
        Batch.tenant_id == tenant_id, Batch.model == model, Batch.in_progress_at >= since)) or 0
    if used + tokens <= limit:
        return None
    holds = f"{tokens:,}" if exact else f"up to {tokens:,}"
    return {"code": "token_limit_exceeded", "line": None, "param": None,
            "message": f"Enqueued token limit reached for {model} in project {tenant_id}. "
                       f"Limit: {limit:,} enqueued tokens; this batch holds {holds} and "
                       f"{int(used):,} were enqueued in the last day. Please try again once "
                       "some in_progress batches have been completed."}
