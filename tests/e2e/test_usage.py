"""Usage and cost you can bill: the Admin API's usage and costs endpoints read by the
official SDK's admin client in strict response validation, and the records behind
them written by real workers running the real models.

- bucket arithmetic, group_by, filters and pages over known records (the app in
  this process, a database of the test's own);
- a batch, jobs and realtime requests of one project through the session's stack:
  the usage API's totals equal the sum over the output lines and responses, and
  the batch's ``usage``; every record has accelerator-seconds and a cost of
  seconds times the price;
- the same after a worker was SIGKILLed mid-batch (a stack with a database of
  its own): the chunk in flight is counted once, by the attempt that committed it.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from openai import OpenAI
from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.schema import Shard, UsageRecord
from jobs.core.settings import Settings
from jobs.tenants import auth, usage
from tests.helpers import chat_line, emb_line, jsonl, lines, upload, wait
from tests.polling import until

EMB_MODEL, CHAT_MODEL = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
DAY, HOUR = 86400, 3600
T0 = 1_700_006_400  # a UTC midnight, long before any work of this test session


def admin_client(base_url: str, admin_key: str, **kw: Any) -> Any:
    return OpenAI(base_url=base_url, admin_api_key=admin_key, api_key="unused",
                  _strict_response_validation=True, max_retries=0, timeout=60,
                  **kw).admin.organization


# The query API over known records -----------------------------------------------------------

@pytest.fixture
def uctx(own_settings: Settings) -> Iterator[Context]:
    c = Context(own_settings)
    yield c
    c.close()


@pytest.fixture
def wsgi(uctx: Context) -> httpx.Client:
    """The app in this process, reached through httpx (what the SDK speaks)."""
    from api.app import create_app

    return httpx.Client(transport=httpx.WSGITransport(app=create_app(uctx.settings)),
                        base_url="http://inferq.test")


def put(ctx: Context, at: float, tenant: str, kind: str = "completions", **kw: Any) -> None:
    fields: dict[str, Any] = {"source": f"job:{secrets.token_hex(8)}", "tenant_id": tenant,
                              "api_key_id": None, "kind": kind, "model": CHAT_MODEL,
                              "lane": "jobs", **kw}
    with ctx.db.session() as s:
        assert usage.record(s, usage.entry(ctx.settings, **fields), at)


def totals(page: Any) -> dict[str, int]:
    out = {"buckets": len(page.data), "input": 0, "output": 0, "requests": 0}
    for b in page.data:
        for r in b.results:
            out["input"] += r.input_tokens
            out["output"] += getattr(r, "output_tokens", 0)
            out["requests"] += r.num_model_requests
    return out


def test_buckets_group_by_filters_and_pages(uctx: Context, wsgi: httpx.Client) -> None:
    a, key_a = auth.create_tenant(uctx, "team-a")
    b, _ = auth.create_tenant(uctx, "team-b")
    admin_key = "sk-admin-" + secrets.token_hex(8)
    auth.ensure_admin_key(uctx, admin_key)
    # Day 0: two of A's requests (one a batch chunk of 5 on flex), one of B's; day 2: B's
    # embeddings; day 1 is empty.
    put(uctx, T0 + 10, a, input_tokens=100, output_tokens=7, accelerator_seconds=1.5)
    put(uctx, T0 + 2 * HOUR, a, lane="flex", service_tier="flex", batch_id="batch_1",
        num_requests=5, input_tokens=50, output_tokens=20, accelerator_seconds=3.0,
        source="chunk:batch_1.000000:0")
    put(uctx, T0 + 3 * HOUR, b, input_tokens=1, output_tokens=2, accelerator_seconds=0.5,
        api_key_id="key_b")
    put(uctx, T0 + 2 * DAY + 5, b, kind="embeddings", model=EMB_MODEL, input_tokens=40,
        lane="realtime", accelerator_seconds=0.25)
    org = admin_client("http://inferq.test/v1", admin_key, http_client=wsgi)

    week = org.usage.completions(start_time=T0, end_time=T0 + 7 * DAY)
    assert [(x.start_time, x.end_time) for x in week.data] == [
        (T0 + i * DAY, T0 + (i + 1) * DAY) for i in range(7)]  # empty buckets included
    assert week.has_more is False and week.next_page is None
    day0 = week.data[0].results
    assert len(day0) == 1 and (day0[0].input_tokens, day0[0].output_tokens,
                               day0[0].num_model_requests) == (151, 29, 7)
    assert day0[0].project_id is None and day0[0].model is None
    assert all(x.results == [] for x in week.data[1:])

    by = org.usage.completions(start_time=T0, end_time=T0 + DAY,
                               group_by=["project_id", "batch", "service_tier"])
    got = {(r.project_id, r.batch, r.service_tier): (r.input_tokens, r.num_model_requests)
           for r in by.data[0].results}
    assert got == {(a, False, "default"): (100, 1), (a, True, "flex"): (50, 5),
                   (b, False, "default"): (1, 1)}
    only_batch = org.usage.completions(start_time=T0, end_time=T0 + DAY, batch=True)
    assert totals(only_batch)["requests"] == 5
    keyed = org.usage.completions(start_time=T0, end_time=T0 + DAY, api_key_ids=["key_b"],
                                  group_by=["api_key_id"])
    assert [(r.api_key_id, r.input_tokens) for r in keyed.data[0].results] == [("key_b", 1)]

    # Hourly buckets: a start inside an hour is the first bucket's start; the query's
    # end clips the last one; a page holds `limit` buckets and its cursor the next.
    hours = org.usage.completions(start_time=T0 + 60, end_time=T0 + 3 * HOUR + 30,
                                  bucket_width="1h", limit=2, project_ids=[a])
    assert [(x.start_time, x.end_time) for x in hours.data] == [
        (T0 + 60, T0 + HOUR), (T0 + HOUR, T0 + 2 * HOUR)]
    assert hours.has_more and hours.next_page
    assert totals(hours)["input"] == 0  # A's first request was at T0 + 10, before the start
    rest = org.usage.completions(start_time=T0 + 60, end_time=T0 + 3 * HOUR + 30,
                                 bucket_width="1h", limit=2, project_ids=[a],
                                 page=hours.next_page)
    assert [(x.start_time, x.end_time) for x in rest.data] == [
        (T0 + 2 * HOUR, T0 + 3 * HOUR), (T0 + 3 * HOUR, T0 + 3 * HOUR + 30)]
    assert rest.has_more is False and totals(rest)["input"] == 50

    emb = org.usage.embeddings(start_time=T0, end_time=T0 + 3 * DAY, group_by=["model"])
    assert [[(r.model, r.input_tokens) for r in x.results] for x in emb.data] == [
        [], [], [(EMB_MODEL, 40)]]

    st = uctx.settings
    costs = org.usage.costs(start_time=T0, end_time=T0 + 3 * DAY, group_by=["line_item"])
    items = {r.line_item: (r.amount.value, r.quantity) for r in costs.data[0].results}
    assert items == {
        f"{CHAT_MODEL}, default": (pytest.approx(usage.cost(st, CHAT_MODEL, "default", 2.0)),
                                   2.0),
        f"{CHAT_MODEL}, flex": (pytest.approx(usage.cost(st, CHAT_MODEL, "flex", 3.0)), 3.0)}
    assert all(r.amount.currency == "usd" for r in costs.data[0].results)
    flex_share = usage.cost(st, CHAT_MODEL, "flex", 3.0) / usage.cost(st, CHAT_MODEL,
                                                                      "default", 3.0)
    assert flex_share == st.usage_flex_multiplier < 1
    per_project = org.usage.costs(start_time=T0, end_time=T0 + 3 * DAY, group_by=["project_id"],
                            project_ids=[b])
    assert [[r.project_id for r in x.results] for x in per_project.data] == [[b], [], [b]]

    # A project key is not an admin key; bad parameters are 400s in OpenAI's shape.
    r = wsgi.get("/v1/organization/usage/completions", params={"start_time": T0},
                 headers={"Authorization": f"Bearer {key_a}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_permissions"
    admin_auth = {"Authorization": f"Bearer {admin_key}"}
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("usage/completions", {}, "start_time"),
        ("usage/completions", {"start_time": T0, "bucket_width": "1w"}, "bucket_width"),
        ("usage/completions", {"start_time": T0, "limit": 32}, "limit"),
        ("usage/completions", {"start_time": T0, "page": "page_x"}, "page"),
        ("usage/embeddings", {"start_time": T0, "group_by[]": "batch"}, "group_by"),
        ("costs", {"start_time": T0, "bucket_width": "1m"}, "bucket_width"),
        ("costs", {"start_time": T0 + DAY, "end_time": T0}, "end_time"),
    ]
    for path, params, param in bad:
        r = wsgi.get(f"/v1/organization/{path}", params=params, headers=admin_auth)
        assert r.status_code == 400, (path, params, r.text)
        assert r.json()["error"]["param"] == param


# Real workers -------------------------------------------------------------------------------


def project(ctx: Context) -> tuple[str, str, str, str]:
    """A project of this test's own: (project id, its key, the key's id, an admin key)."""
    tenant, key = auth.create_tenant(ctx, f"usage-{secrets.token_hex(4)}")
    admin_key = "sk-admin-" + secrets.token_hex(8)
    auth.ensure_admin_key(ctx, admin_key)
    return tenant, key, auth.authenticate(ctx, key).api_key_id, admin_key


def records(ctx: Context, **where: Any) -> list[UsageRecord]:
    with ctx.db.session() as s:
        q = select(UsageRecord).filter_by(**where)
        return list(s.scalars(q))


def line_tokens(out: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(ok lines, prompt tokens, completion tokens) over a batch's output lines."""
    ok = [x["response"]["body"]["usage"] for x in out if x["response"]["status_code"] == 200]
    return (len(ok), sum(u["prompt_tokens"] for u in ok),
            sum(u.get("completion_tokens", 0) for u in ok))


def summed(page: Any, **match: Any) -> tuple[int, int, int]:
    """(num_model_requests, input tokens, output tokens) over a page's results."""
    rs = [r for b in page.data for r in b.results
          if all(getattr(r, k) == v for k, v in match.items())]
    return (sum(r.num_model_requests for r in rs), sum(r.input_tokens for r in rs),
            sum(getattr(r, "output_tokens", 0) for r in rs))


def assert_priced(ctx: Context, recs: list[UsageRecord]) -> None:
    for r in recs:
        assert r.accelerator_seconds > 0, r.source
        assert r.cost == pytest.approx(usage.cost(ctx.settings, r.model, r.service_tier,
                                                  r.accelerator_seconds), rel=1e-9)


@pytest.mark.slow
def test_batch_jobs_and_realtime_usage_adds_up(stack: Any, ctx: Context) -> None:
    tenant, key, key_id, admin_key = project(ctx)
    sdk = OpenAI(base_url=stack.base_url + "/v1", api_key=key,
                 _strict_response_validation=True, max_retries=0, timeout=120)
    org = admin_client(stack.base_url + "/v1", admin_key)
    start = int(time.time()) - 1
    emb_rows = [emb_line(i, f"usage line {i} about markets " * (1 + i % 7)) for i in range(300)]
    chat_rows = [chat_line(i, f"Name one {w}.", CHAT_MODEL, max_tokens=6)
                 for i, w in enumerate(["colour", "fruit", "city", "animal"])]
    eb = sdk.batches.create(input_file_id=upload(sdk, jsonl(emb_rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    cb = sdk.batches.create(input_file_id=upload(sdk, jsonl(chat_rows)).id,
                            endpoint="/v1/chat/completions", completion_window="24h")
    http = httpx.Client(base_url=stack.base_url, timeout=60,
                        headers={"Authorization": f"Bearer {key}"})
    job_bodies = [("/v1/embeddings", {"model": EMB_MODEL, "input": ["a job", "two inputs"]}),
                  ("/v1/chat/completions", {"model": CHAT_MODEL, "max_tokens": 5,
                                            "temperature": 0,
                                            "messages": [{"role": "user", "content": "Hi"}]})]
    job_ids = [http.post("/v1/jobs", json={"endpoint": ep, "body": body}).json()["id"]
               for ep, body in job_bodies]
    rt_emb = [sdk.embeddings.create(model=EMB_MODEL, input=x, encoding_format="float")
              for x in ("one realtime request", ["and", "three", "inputs"])]
    msgs: Any = [{"role": "user", "content": "What is the capital of France?"}]
    rt_chat = sdk.chat.completions.create(model=CHAT_MODEL, messages=msgs, temperature=0,
                                          max_tokens=8)
    chunks = list(sdk.chat.completions.create(model=CHAT_MODEL, messages=msgs, temperature=0,
                                              max_tokens=6, stream=True,
                                              stream_options={"include_usage": True}))
    streamed = chunks[-1].usage
    assert streamed is not None

    def job_done(jid: str) -> Any:
        j = http.get(f"/v1/jobs/{jid}").json()
        return j if j["status"] in ("completed", "failed") else None

    jobs = [until(lambda jid=jid: job_done(jid), what=f"job {jid}") for jid in job_ids]
    assert [j["status"] for j in jobs] == ["completed", "completed"]
    eb, cb = wait(sdk, eb.id), wait(sdk, cb.id)
    assert eb.status == cb.status == "completed"
    emb_lines, chat_lines = line_tokens(lines(sdk, eb.output_file_id)), line_tokens(
        lines(sdk, cb.output_file_id))
    assert emb_lines[0] == 300 and chat_lines[0] == 4
    # The batch object's usage is the sum of its lines, and so are its usage records.
    for b, (n, inp, out) in ((eb, emb_lines), (cb, chat_lines)):
        assert b.usage is not None and (b.usage.input_tokens, b.usage.output_tokens) == (inp, out)
        recs = records(ctx, batch_id=b.id)
        assert (sum(r.num_requests for r in recs), sum(r.input_tokens for r in recs),
                sum(r.output_tokens for r in recs)) == (n, inp, out)
        assert {r.lane for r in recs} == {"batch"} and {r.api_key_id for r in recs} == {key_id}

    emb_job, chat_job = (j["result"]["usage"] for j in jobs)
    want_emb = (300 + 1 + 2, emb_lines[1] + emb_job["prompt_tokens"]
                + sum(r.usage.prompt_tokens for r in rt_emb), 0)
    rt_usage = [rt_chat.usage, streamed]
    want_chat_direct = (1 + 2, chat_job["prompt_tokens"]
                        + sum(u.prompt_tokens for u in rt_usage if u),
                        chat_job["completion_tokens"]
                        + sum(u.completion_tokens for u in rt_usage if u))
    # Realtime usage is written by the worker after it answered: wait for it to land.
    emb_page = until(lambda: org.usage.embeddings(
        start_time=start, project_ids=[tenant], group_by=["api_key_id"]),
        lambda p: summed(p)[0] == want_emb[0])
    assert summed(emb_page) == want_emb
    assert summed(emb_page, api_key_id=key_id) == want_emb  # all of it billed to the key
    chat_page = until(lambda: org.usage.completions(
        start_time=start, project_ids=[tenant], group_by=["batch", "model"]),
        lambda p: summed(p, batch=False)[0] == 3)
    assert summed(chat_page, batch=True, model=CHAT_MODEL) == chat_lines
    assert summed(chat_page, batch=False, model=CHAT_MODEL) == want_chat_direct

    mine = records(ctx, tenant_id=tenant)
    assert {r.lane for r in mine} == {"realtime", "jobs", "batch"}
    assert len({r.source for r in mine}) == len(mine)
    assert_priced(ctx, mine)
    costs = org.usage.costs(start_time=start, project_ids=[tenant])
    billed = sum(r.amount.value for b in costs.data for r in b.results if r.amount)
    assert billed == pytest.approx(sum(r.cost for r in mine), rel=1e-6)
    assert billed > 0


@pytest.mark.slow
def test_usage_counts_once_after_a_worker_was_killed_mid_batch(fstack: Any, workers: Any,
                                                               fctx: Context) -> None:
    tenant, key, key_id, admin_key = project(fctx)
    sdk = OpenAI(base_url=fstack.base_url + "/v1", api_key=key,
                 _strict_response_validation=True, max_retries=0, timeout=120)
    start = int(time.time()) - 1
    rows = [emb_line(i, f"sentence number {i} about cats and markets " * (1 + i % 5))
            for i in range(800)]
    first = workers("usage-k1")
    b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                           endpoint="/v1/embeddings", completion_window="24h")

    def shards() -> list[Shard]:
        with fctx.db.session() as s:
            return list(s.scalars(select(Shard).where(Shard.batch_id == b.id)))

    until(lambda: any(s.chunks_done >= 2 and s.status == "running" for s in shards()),
             what="a shard in progress")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    workers("usage-k2")
    b = wait(sdk, b.id, timeout=300)
    assert b.status == "completed" and b.request_counts.completed == 800
    done = shards()
    assert max(s.attempt for s in done) >= 2  # the killed worker's shard was taken over
    n, inp, _ = line_tokens(lines(sdk, b.output_file_id))
    assert n == 800 and b.usage.input_tokens == inp
    recs = records(fctx, batch_id=b.id)
    # One record per committed chunk, whichever attempt committed it; none for the work
    # the killed worker did past its last checkpoint.
    assert sorted(r.source for r in recs) == sorted(
        f"chunk:{s.id}:{c}" for s in done for c in range(s.chunks_done))
    assert (sum(r.num_requests for r in recs), sum(r.input_tokens for r in recs)) == (800, inp)
    assert {r.api_key_id for r in recs} == {key_id}
    assert_priced(fctx, recs)
    page = admin_client(fstack.base_url + "/v1", admin_key).usage.embeddings(
        start_time=start, project_ids=[tenant])
    assert summed(page) == (800, inp, 0)
