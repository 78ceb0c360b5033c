"""The outbox loses no delivery: the control worker is killed (SIGKILL) while it is
sending an event, then PostgreSQL and Redis restart, then a new control worker starts;
the event still arrives, under the same ``webhook-id``, verified with the SDK.

The module runs its own PostgreSQL (pgserver) and redis-server, never the machine's,
and a stack on them (API + control worker, no model worker).
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from typing import Any

import pytest
from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.webhook_tables import WebhookAttempt, WebhookDelivery, WebhookEvent
from storage.embedded import EmbeddedRedis
from tests.helpers import jsonl, wait
from tests.receiver import receiver
from tests.stacks import Database, running_stack, sdk_of

pytestmark = pytest.mark.slow
READ_TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def dstack(settings, broker, database, s3_endpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    with running_stack(settings, s3_endpoint, tmp_path_factory.mktemp("wdlogs"),
                       model_workers=0, redis_url=broker.url, database_url=database.url,
                       chat_model="", data_dir=tmp_path_factory.mktemp("wd"),
                       janitor_interval_s=1.0, webhook_allow_hosts="127.0.0.1",
                       webhook_connect_timeout_s=1.0, webhook_read_timeout_s=READ_TIMEOUT_S,
                       webhook_lease_margin_s=1.0, webhook_retry_base_s=0.3,
                       webhook_retry_max_s=1.0, webhook_poll_interval_s=0.05) as stack:
        yield stack


def kill_control(stack: Any) -> None:
    p = stack.procs.pop("worker-control")
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def start_control(stack: Any) -> None:
    from cli.command_lines import worker_command

    stack.spawn("worker-control", worker_command("control", "control"), INFERQ_LANES="control")


def test_a_killed_control_worker_and_backend_restarts_lose_no_delivery(
        dstack: Any, database: Database, broker: EmbeddedRedis) -> None:
    sdk = sdk_of(dstack, timeout=60)
    accepting = False
    with receiver(lambda _w, _n: "ok" if accepting else "hang",
                  hang_s=READ_TIMEOUT_S + 3) as rx:
        hook = sdk.webhooks.create(name="durable", url=rx.url(),
                                   event_types=["batch.failed", "batch.completed"])
        f = sdk.files.create(file=("in.jsonl", io.BytesIO(jsonl([
            {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}]))),
            purpose="batch")
        b = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                               completion_window="24h")
        assert wait(sdk, b.id, 60).status == "failed"  # its event committed with it
        rx.wait_for(lambda: len(rx.requests) >= 1, 30, "the first attempt")
        kill_control(dstack)  # mid-send: the receiver has not answered it
        first = rx.requests[0]
        assert json.loads(first.body)["data"]["id"] == b.id and not rx.accepted()

        ctx = Context(dstack.settings)
        try:
            with ctx.db.session() as s:
                d = s.scalars(select(WebhookDelivery).join(
                    WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id).where(
                    WebhookEvent.subject_id == b.id)).one()
                assert (d.id, d.status, d.delivered_at) == (first.webhook_id, "pending", None)
            ctx.db.dispose()
            database.stop()
            broker.stop()
            time.sleep(1)
            broker.start()
            database.start()
            accepting = True
            start_control(dstack)
            rx.wait_for(lambda: bool(rx.accepted()), 90, "the delivery after the restarts")
            got = rx.accepted()[0]
            assert got.webhook_id == first.webhook_id  # the same delivery, sent again
            event = sdk.webhooks.unwrap(got.body, got.headers, secret=hook.signing_secret)
            assert (event.type, event.data.id) == ("batch.failed", b.id)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with ctx.db.session() as s:
                    d = s.get(WebhookDelivery, first.webhook_id)
                    assert d is not None
                    if d.status == "delivered":
                        break
                time.sleep(0.2)
            assert d.status == "delivered"
            with ctx.db.session() as s:
                codes = s.scalars(select(WebhookAttempt.status_code).where(
                    WebhookAttempt.delivery_id == d.id).order_by(WebhookAttempt.id)).all()
            # the killed attempt left no log row (its sender died); the new one is a 200
            assert codes[-1] == 200 and d.attempts >= 2
        finally:
            ctx.close()
        # and the restarted control worker delivers new events, also after PostgreSQL
        # restarts under it (its delivery loop and its LISTEN connection reconnect)
        for restart in (False, True):
            if restart:
                database.stop()
                time.sleep(2)
                database.start()
            f2 = sdk.files.create(file=("in.jsonl", io.BytesIO(jsonl([
                {"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": {}}]))),
                purpose="batch")
            b2 = sdk.batches.create(input_file_id=f2.id, endpoint="/v1/embeddings",
                                    completion_window="24h")
            rx.wait_for(lambda: any(json.loads(r.body)["data"]["id"] == b2.id  # noqa: B023
                                    for r in rx.accepted()), 60, "a new event")
