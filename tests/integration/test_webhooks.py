"""Webhooks end to end: endpoints through the ``openai`` SDK in strict mode, every event a
batch or job can end with delivered to a real receiver on 127.0.0.1 through failures
(500s and timeouts), verified with the SDK's ``client.webhooks.unwrap``; per-request
callbacks signed with the project's callback secret; the delivery log and resends;
another project's ids are 404.

The module runs its own stack (API + control worker, no model worker) on a database
and a Redis DB of its own, with short retry delays and timeouts. A job's outcome is
stored by the test itself, through the functions a jobs worker calls
(``asyncjobs.claim`` / ``complete``): the status change, and with it the event.
"""

from __future__ import annotations

import io
import itertools
import json
import secrets
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, cast

import httpx2
import openai
import pytest
from sqlalchemy import select, update

from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.core.context import Context
from jobs.core.schema import Batch
from jobs.core.webhook_tables import WebhookAttempt, WebhookDelivery, WebhookEvent
from jobs.tenants import auth
from tests.conftest import RedisDatabases, free_port, fresh_database
from tests.helpers import emb_line, jsonl, wait
from tests.receiver import receiver
from tests.stacks import context_of, running_stack, sdk_of

ALL_EVENTS = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled",
              "job.completed", "job.failed"]
MODEL = "all-MiniLM-L6-v2"
READ_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def wstack(settings, pg_admin_url: str, redis_dbs: RedisDatabases, s3_endpoint: str,  # type: ignore[no-untyped-def]
           tmp_path_factory: pytest.TempPathFactory):
    with fresh_database(pg_admin_url) as db, redis_dbs.lend() as rdb, running_stack(
            settings, s3_endpoint, tmp_path_factory.mktemp("wlogs"), model_workers=0,
            database_url=db, redis_url=rdb, chat_model="", webhook_allow_hosts="127.0.0.1",
            webhook_connect_timeout_s=1.0, webhook_read_timeout_s=READ_TIMEOUT_S,
            webhook_lease_margin_s=1.0, webhook_retry_base_s=0.3, webhook_retry_max_s=2.0,
            webhook_poll_interval_s=0.05, janitor_interval_s=1.0, webhook_concurrency=4,
            webhook_concurrency_per_target=2, stranded_shard_s=5.0) as stack:
        yield stack


@pytest.fixture(scope="module")
def wctx(wstack) -> Iterator[Context]:  # type: ignore[no-untyped-def]
    with context_of(wstack) as c:
        yield c


def http_for(stack: Any, key: str) -> httpx2.Client:
    return httpx2.Client(base_url=stack.base_url + "/v1", timeout=60,
                         headers={"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def other_key(wctx: Context) -> str:
    return auth.create_tenant(wctx, f"other-{secrets.token_hex(3)}")[1]


def test_endpoints_through_the_sdk(wstack: Any, other_key: str) -> None:
    sdk, other = sdk_of(wstack, wstack.api_key, timeout=60), sdk_of(wstack, other_key, timeout=60)
    with receiver() as rx:
        created = sdk.webhooks.create(name="etl", url=rx.url(),
                                      event_types=["batch.completed", "batch.failed"])
        secret = created.signing_secret
        assert secret.startswith("whsec_") and created.signing_secret_hint == \
            f"whsec_...{secret[-4:]}"
        assert created.object == "webhook_endpoint" and created.url == rx.url()
        got = sdk.webhooks.retrieve(created.id)
        assert (got.id, got.name, got.event_types) == (created.id, "etl",
                                                       ["batch.completed", "batch.failed"])
        assert created.id in [e.id for e in sdk.webhooks.list()]
        updated = sdk.webhooks.update(created.id, name="etl-2",
                                      event_types=["batch.cancelled"])
        assert (updated.name, updated.event_types) == ("etl-2", ["batch.cancelled"])
        assert {"batch.completed", "job.completed"} <= set(sdk.webhooks.event_types.list().data)

        result = sdk.webhooks.test(created.id, event_type="batch.completed")
        assert (result.status_code, result.success, result.webhook_endpoint_id) == (
            200, True, created.id)
        sample = rx.accepted()[-1]
        event = sdk.webhooks.unwrap(sample.body, sample.headers, secret=secret)
        assert event.type == "batch.completed" and event.object == "event"

        # a rotation that keeps the old secret: deliveries verify with either for 24 h
        rotated = sdk.webhooks.rotate_secret(created.id, keep_old_secret_active_for_24_hours=True)
        assert rotated.signing_secret != secret
        sdk.webhooks.test(created.id, event_type="batch.failed")
        sample = rx.accepted()[-1]
        for key in (secret, rotated.signing_secret):
            assert sdk.webhooks.unwrap(sample.body, sample.headers, secret=key).type == \
                "batch.failed"
        fresh = sdk.webhooks.rotate_secret(created.id)  # the previous one is dead at once
        sdk.webhooks.test(created.id, event_type="batch.failed")
        sample = rx.accepted()[-1]
        sdk.webhooks.unwrap(sample.body, sample.headers, secret=fresh.signing_secret)
        with pytest.raises(openai.InvalidWebhookSignatureError):
            sdk.webhooks.unwrap(sample.body, sample.headers, secret=rotated.signing_secret)

        # another project's key: every id route is a 404
        for call in (lambda: other.webhooks.retrieve(created.id),
                     lambda: other.webhooks.update(created.id, name="x"),
                     lambda: other.webhooks.rotate_secret(created.id),
                     lambda: other.webhooks.test(created.id, event_type="batch.failed"),
                     lambda: other.webhooks.delete(created.id)):
            with pytest.raises(openai.NotFoundError):
                call()
        assert created.id not in [e.id for e in other.webhooks.list()]
        with http_for(wstack, other_key) as h:
            assert h.get(f"/webhook_endpoints/{created.id}/deliveries").status_code == 404

        deleted = sdk.webhooks.delete(created.id)
        assert (deleted.id, deleted.deleted, deleted.object) == (
            created.id, True, "webhook_endpoint.deleted")
        with pytest.raises(openai.NotFoundError):
            sdk.webhooks.retrieve(created.id)


@pytest.mark.parametrize("url,why", [
    ("ftp://127.0.0.1/hook", "only http:// and https://"),
    ("http://10.1.2.3/hook", "private"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://[::1]:9/hook", "loopback"),
])
def test_a_url_that_may_not_be_sent_to_is_a_400(wstack: Any, url: str, why: str) -> None:
    sdk = sdk_of(wstack, wstack.api_key, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.webhooks.create(name="x", url=url, event_types=["batch.failed"])
    assert why in e.value.message and e.value.code == "invalid_url"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.post("/jobs", cast_to=object, body={
            "endpoint": "/v1/embeddings", "body": {"model": MODEL, "input": "x"},
            "callback_url": url})
    assert e.value.param == "callback_url" and e.value.code == "invalid_url"


def test_unknown_event_types_and_a_missing_callback_secret_are_400(wstack: Any,
                                                                   other_key: str) -> None:
    sdk = sdk_of(wstack, wstack.api_key, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.webhooks.create(name="x", url="http://127.0.0.1:9/h",
                            event_types=["response.completed"])
    assert e.value.code == "unsupported_event_type"
    with receiver() as rx:  # the other project never made its callback secret
        with pytest.raises(openai.BadRequestError) as e:
            sdk_of(wstack, other_key, timeout=60).post("/jobs", cast_to=object, body={
                "endpoint": "/v1/embeddings", "body": {"model": MODEL, "input": "x"},
                "callback_url": rx.url()})
    assert e.value.code == "callback_secret_missing"


@pytest.mark.parametrize("answer", ["200", "302", "401", "405", "500", "refused"])
def test_a_test_delivery_succeeds_only_when_a_delivery_would(wstack: Any, answer: str) -> None:
    """The rule of real deliveries (a 2xx answer, redirects not followed): a test
    answered otherwise is a 400 saying what the endpoint answered, never a success."""
    sdk = sdk_of(wstack, wstack.api_key, timeout=60)
    with receiver(lambda _wid, _n: answer) as rx:
        url = (f"http://127.0.0.1:{free_port()}/hook" if answer == "refused"  # nothing listens
               else rx.url())
        endpoint = sdk.webhooks.create(name="probe", url=url, event_types=["batch.failed"])
        try:
            if answer == "200":
                result = sdk.webhooks.test(endpoint.id, event_type="batch.failed")
                assert (result.success, result.status_code) == (True, 200)
            else:
                with pytest.raises(openai.BadRequestError) as e:
                    sdk.webhooks.test(endpoint.id, event_type="batch.failed")
                assert e.value.param == "webhook_endpoint_id", e.value.body
                if answer == "refused":
                    assert e.value.code == "webhook_unreachable", e.value.body
                    assert "did not answer" in e.value.message
                else:
                    assert e.value.code == "webhook_test_failed", e.value.body
                    assert f"answered {answer}" in e.value.message
                    assert ("redirects are not followed" in e.value.message) == \
                        answer.startswith("3")
            assert [r.answer for r in rx.requests] == ([] if answer == "refused" else [answer])
        finally:
            sdk.webhooks.delete(endpoint.id)


def flaky(_wid: str, n: int) -> str:
    """Each delivery: a 500, then a timeout, then accepted."""
    return {1: "fail", 2: "hang"}.get(n, "ok")


def ended_job(ctx: Context, job_id: str, error: bool) -> None:
    """Store the job's outcome as a jobs worker does (claim, then complete)."""
    token = secrets.token_hex(8)
    assert [j.id for j in asyncjobs.claim(ctx, [job_id], "test-worker", token, 60)] == [job_id]
    result = None if error else {"object": "list", "data": [], "model": MODEL,
                                 "usage": {"prompt_tokens": 1, "total_tokens": 1}}
    err = {"code": "test_failure", "message": "failed on purpose"} if error else None
    assert asyncjobs.complete(ctx, job_id, token, result, err)


def test_every_event_arrives_signed_through_failures(wstack: Any, wctx: Context) -> None:
    sdk = sdk_of(wstack, wstack.api_key, timeout=60)
    with receiver(flaky, hang_s=READ_TIMEOUT_S + 1.0) as rx, \
            http_for(wstack, wstack.api_key) as h:
        endpoint = sdk.webhooks.create(name="all", url=rx.url("/hook"),
                                       event_types=cast(Any, ALL_EVENTS))
        cb = h.post("/webhook_callback_secret", json={})
        assert cb.status_code == 200, cb.text
        callback_secret = cb.json()["signing_secret"]
        assert h.get("/webhook_callback_secret").json()["signing_secret_hint"] == \
            f"whsec_...{callback_secret[-4:]}"
        callback = rx.url("/callback")

        def batch(lines: list[dict[str, Any]], **extra: Any) -> str:
            f = sdk.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
            return sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                      completion_window="24h", **extra).id

        expect: dict[str, str] = {}  # subject id -> event type
        failed = batch([{"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                         "body": {"input": "no model"}}])
        expect[failed] = "batch.failed"
        completed = batch([emb_line(0, "")])  # every request invalid: completes, no shard
        expect[completed] = "batch.completed"
        cancelled = batch([emb_line(i, f"row {i}") for i in range(5)],
                          extra_body={"callback_url": callback})
        expect[cancelled] = "batch.cancelled"
        expired = batch([emb_line(i, f"row {i}") for i in range(5)])
        expect[expired] = "batch.expired"
        for b in (cancelled, expired):  # no model worker: their shards wait
            wait(sdk, b, 60, until=("in_progress",))
        sdk.batches.cancel(cancelled)
        with wctx.db.session() as s:  # its window has passed: the janitor expires it
            s.execute(update(Batch).where(Batch.id == expired).values(expires_at=1))
        jobs = []
        for error in (False, True):
            r = h.post("/jobs", json={"endpoint": "/v1/embeddings",
                                      "body": {"model": MODEL, "input": "x"},
                                      "callback_url": callback})
            assert r.status_code == 200, r.text
            assert r.json()["callback_url"] == callback
            jobs.append(r.json()["id"])
            ended_job(wctx, jobs[-1], error)
            expect[jobs[-1]] = "job.failed" if error else "job.completed"
        for b in (failed, completed, cancelled, expired):
            assert wait(sdk, b, 60).status == expect[b].split(".")[1]

        callbacks = {cancelled, *jobs}
        targets = {("/hook", subject) for subject in expect} | {
            ("/callback", subject) for subject in callbacks}

        def arrived() -> set[tuple[str, str]]:
            return {(r.path, json.loads(r.body)["data"]["id"]) for r in rx.accepted()}

        rx.wait_for(lambda: targets <= arrived(), 90, "every event at every target")

        # every accepted delivery verifies with the SDK, with its target's secret
        for r in rx.accepted():
            key = endpoint.signing_secret if r.path == "/hook" else callback_secret
            event = sdk.webhooks.unwrap(r.body, r.headers, secret=key)
            assert event.type == expect[event.data.id]
            raw = json.loads(r.body)
            assert set(raw) == {"id", "object", "created_at", "type", "data"}
            assert raw["object"] == "event" and raw["data"] == {"id": event.data.id}
        # one webhook-id per event and target, kept over its 500, its timeout and its 200
        ids: dict[tuple[str, str], set[str]] = defaultdict(set)
        answers: dict[str, list[str]] = defaultdict(list)
        for r in rx.requests:
            ids[(r.path, json.loads(r.body)["id"])].add(r.webhook_id)
            answers[r.webhook_id].append(r.answer)
        assert all(len(v) == 1 for v in ids.values()), ids
        assert len(ids) == len(targets)
        for wid in {next(iter(v)) for v in ids.values()}:
            assert answers[wid][:3] == ["fail", "hang", "ok"], answers[wid]

        # the delivery log: three attempts each (500, a timeout, 200), all delivered
        log = h.get(f"/webhook_endpoints/{endpoint.id}/deliveries").json()
        assert {d["event_type"] for d in log["data"]} == set(ALL_EVENTS)
        for d in log["data"]:
            codes = [a["status_code"] for a in d["attempts"]]
            assert d["status"] == "delivered" and codes[:3] == [500, None, 200], d
            assert "timed out" in d["attempts"][1]["error"]

        # a resend arrives again under the same webhook-id, and is logged
        first = log["data"][0]
        before = len(rx.accepted())
        again = h.post(f"/webhook_endpoints/{endpoint.id}/deliveries/{first['id']}/resend")
        assert again.status_code == 200 and again.json()["status"] == "pending"
        rx.wait_for(lambda: len(rx.accepted()) > before, 30, "the resent delivery")
        assert rx.accepted()[-1].webhook_id == first["id"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            log = h.get(f"/webhook_endpoints/{endpoint.id}/deliveries").json()
            mine = next(d for d in log["data"] if d["id"] == first["id"])
            if mine["status"] == "delivered" and len(mine["attempts"]) == 4:
                break
            time.sleep(0.1)
        assert [a["status_code"] for a in mine["attempts"]][-1] == 200, mine
        assert len(mine["attempts"]) == 4
        other = sdk.webhooks.create(name="o", url=rx.url(), event_types=["batch.failed"])
        with pytest.raises(openai.NotFoundError):  # another endpoint's delivery: none of this
            sdk.post(f"/webhook_endpoints/{other.id}/deliveries/{first['id']}/resend",
                     cast_to=object)

        # the outbox holds one event per status change, each with its deliveries
        with wctx.db.session() as s:
            events = list(s.scalars(select(WebhookEvent).where(
                WebhookEvent.subject_id.in_(list(expect)))))
            assert sorted(e.subject_id for e in events) == sorted(expect)
            n = s.scalars(select(WebhookDelivery.id).where(
                WebhookDelivery.event_id.in_([e.id for e in events]))).all()
            assert len(n) == len(targets)


def test_a_receiver_that_hangs_does_not_hold_up_the_others(wstack: Any, wctx: Context) -> None:
    """A receiver that never answers in time, with a backlog larger than every send slot,
    holds at most its share of the slots (``webhook_concurrency_per_target``), each for
    at most the read timeout: a healthy receiver's events all arrive meanwhile."""
    sdk = sdk_of(wstack, wstack.api_key, timeout=60)
    st = wstack.settings
    with receiver(lambda _w, _n: "hang", hang_s=READ_TIMEOUT_S + 1.0) as slow, \
            receiver() as fast:
        hooks = [sdk.webhooks.create(name=n, url=r.url(), event_types=["batch.failed"])
                 for n, r in (("slow", slow), ("fast", fast))]
        failed = []
        for i in range(2 * st.webhook_concurrency):  # more than every slot
            f = sdk.files.create(file=("in.jsonl", io.BytesIO(jsonl([
                {"custom_id": f"a{i}", "method": "POST", "url": "/v1/embeddings",
                 "body": {}}]))), purpose="batch")
            failed.append(sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                              completion_window="24h").id)

        def fast_got() -> set[str]:
            return {json.loads(r.body)["data"]["id"] for r in fast.accepted()}

        fast.wait_for(lambda: set(failed) <= fast_got(), 60, "every event at the fast one")
        slow.wait_for(lambda: len(slow.requests) > st.webhook_concurrency_per_target, 30,
                      "more attempts at the slow one")
        assert not slow.accepted()
        for hook in hooks:
            sdk.webhooks.delete(hook.id)  # its pending retries go with it
    # the sends to the slow one, as the senders logged them: never more at once than
    # its share (the receiver's own count would include requests the sender gave up on)
    with wctx.db.session() as s:
        spans = s.execute(select(WebhookAttempt.started_at, WebhookAttempt.duration_ms)
                          .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
                          .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
                          .where(WebhookEvent.subject_id.in_(failed),
                                 WebhookAttempt.status_code.is_(None))).all()
    assert len(spans) > st.webhook_concurrency_per_target
    edges = sorted([(a, 1) for a, _ in spans] + [(a + ms / 1000, -1) for a, ms in spans],
                   key=lambda e: (e[0], e[1]))
    at_once = max(itertools.accumulate(step for _, step in edges))
    assert at_once <= st.webhook_concurrency_per_target < st.webhook_concurrency
