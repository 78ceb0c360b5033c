"""The usage of answered realtime requests, recorded by the worker that answered
(``UsageWriter``), not by the API: only the worker knows the request's
accelerator-seconds, and it sees the end of every answer, including streams whose
client went away (billed for what was generated until then) and API processes that
died mid-request. The record's source is ``rt:<request id>`` and a realtime message is
taken by one worker only (BRPOP), so a request is never counted twice; the write
happens off the engine thread once the answer is sent, so the one loss is a worker
killed within that write.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jobs.core import lanes
from jobs.core.context import Context
from jobs.tenants import usage

log = logging.getLogger("inferq.realtime")


class UsageWriter:
    """Records the usage of answered realtime requests on a thread of its own (never
    on the engine thread), billed to the project and key their message names."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-usage")

    def put(self, msg: dict[str, Any], kind: str, input_tokens: int, output_tokens: int,
            seconds: float) -> None:
        tenant = msg.get("tenant_id")
        if not isinstance(tenant, str):  # sent by an API that names no project
            return
        key = msg.get("api_key_id")
        e = usage.entry(self.ctx.settings, source=f"rt:{msg['id']}", tenant_id=tenant,
                        api_key_id=key if isinstance(key, str) else None, kind=kind,
                        model=str(msg["body"].get("model", "")), lane=lanes.REALTIME,
                        input_tokens=input_tokens, output_tokens=output_tokens,
                        accelerator_seconds=seconds)
        self.pool.submit(self._write, e)

    def _write(self, e: usage.Entry) -> None:
        try:
            with self.ctx.db.session() as s:
                usage.record(s, e)
        except Exception as ex:  # noqa: BLE001 - the answer was sent; only its record is lost
            log.warning("usage of %s not recorded: %s", e.source, ex)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
