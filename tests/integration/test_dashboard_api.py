"""GET /v1/dashboard/overview and /v1/dashboard/batches/<id>: who sees what (a project
key its own batches, the admin key every project's), the shapes of docs/API.md
(Dashboard), and the latency history written by the workers' recorder into Redis and
read back per minute (real PostgreSQL, Redis and S3 behind the Flask app; the tests
play the control worker and the model workers, so no worker runs)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from jobs.batches import queries as repo
from jobs.batches import service
from jobs.batches.outputs import Tokens
from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.dispatch import make_celery
from jobs.core.schema import Batch, now
from jobs.core.settings import Settings
from jobs.fleet import catalog, heartbeats, registry
from jobs.slo import stats
from jobs.tenants import auth
from tests.helpers import as_key, submit_batch

MODEL = "all-MiniLM-L6-v2"
OVERVIEW_KEYS = {"object", "scope", "project_id", "generated_at", "lanes", "workers",
                 "latency", "batches"}
BATCH_KEYS = {"id", "project_id", "status", "endpoint", "model", "created_at",
              "request_counts", "rate_per_s", "eta_s"}
SHARD_KEYS = {"index", "status", "rows", "done", "worker", "attempts"}


def assert_error(resp: Any, status: int, etype: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == etype
    return err  # type: ignore[no-any-return]


# Scope and isolation, on the session's app -------------------------------------------------


def test_a_project_key_sees_its_project_and_the_admin_key_every_project(
        app: Any, ctx: Context, tenant_key: str, other_tenant_key: str, admin_key: str) -> None:
    mine = submit_batch(as_key(app, tenant_key))
    theirs = submit_batch(as_key(app, other_tenant_key))
    project = auth.authenticate(ctx, tenant_key).tenant_id

    got = as_key(app, tenant_key).get("/v1/dashboard/overview")
    assert got.status_code == 200, got.get_data(as_text=True)
    body = got.get_json()
    assert set(body) == OVERVIEW_KEYS and body["object"] == "dashboard.overview"
    assert (body["scope"], body["project_id"]) == ("project", project)
    ids = [b["id"] for b in body["batches"]]
    assert mine in ids and theirs not in ids
    assert {b["project_id"] for b in body["batches"]} == {project}
    assert all(set(b) == BATCH_KEYS for b in body["batches"])

    org = as_key(app, admin_key).get("/v1/dashboard/overview").get_json()
    assert (org["scope"], org["project_id"]) == ("organization", None)
    ids = [b["id"] for b in org["batches"]]
    assert {mine, theirs} <= set(ids)
    created = [b["created_at"] for b in org["batches"]]
    assert created == sorted(created, reverse=True) and len(created) <= 50


def test_another_projects_batch_is_not_found(app: Any, tenant_key: str, other_tenant_key: str,
                                             admin_key: str) -> None:
    mine = submit_batch(as_key(app, tenant_key))
    err = assert_error(as_key(app, other_tenant_key).get(f"/v1/dashboard/batches/{mine}"),
                       404, "invalid_request_error")
    assert err["param"] == "batch_id"
    own = as_key(app, tenant_key).get(f"/v1/dashboard/batches/{mine}")
    assert own.status_code == 200 and own.get_json()["batch"]["id"] == mine
    admin = as_key(app, admin_key).get(f"/v1/dashboard/batches/{mine}").get_json()
    assert admin["object"] == "dashboard.batch" and admin["batch"]["id"] == mine
    assert_error(as_key(app, tenant_key).get("/v1/dashboard/batches/batch_0000000000000000"),
                 404, "invalid_request_error")


@pytest.mark.parametrize("key", [None, "iq-not-a-key", ""])
def test_any_other_key_is_refused(app: Any, key: str | None) -> None:
    for path in ("/v1/dashboard/overview", "/v1/dashboard/batches/batch_x"):
        err = assert_error(as_key(app, key).get(path), 401, "invalid_request_error")
        assert err["code"] == "invalid_api_key"


@pytest.mark.parametrize("window", ["59", "86401", "abc", "1e3", "", "-60", "6_0", "3600.0",
                                    "9" * 40])
def test_a_bad_window_is_a_400(app: Any, tenant_key: str, window: str) -> None:
    err = assert_error(as_key(app, tenant_key).get(f"/v1/dashboard/overview?window={window}"),
                       400, "invalid_request_error")
    assert err["param"] == "window"


def test_the_window_is_echoed(app: Any, admin_key: str) -> None:
    for window in (60, 86400):
        got = as_key(app, admin_key).get(f"/v1/dashboard/overview?window={window}")
        assert got.get_json()["latency"]["window_s"] == window
        assert got.get_json()["latency"]["step_s"] == 60


# A batch with shards, queues, workers and latencies, on a database and Redis DB of its own -


@dataclass
class Own:
    app: Any
    ctx: Context
    r: redis.Redis
    tenant_id: str
    key: str
    other_key: str
    admin_key: str

    def get(self, path: str, key: str | None = None) -> Any:
        resp = as_key(self.app, key or self.key).get(path)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        return resp.get_json()


@pytest.fixture
def own(own_settings: Settings) -> Iterator[Own]:
    from api.app import create_app

    app = create_app(own_settings.model_copy(update={"shard_rows": 100, "chunk_rows": 50}))
    ctx: Context = app.extensions["inferq"]
    registry.register(ctx, MODEL, "1", "embeddings", "test",  # a registry row only
                      [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}], 256)
    catalog.invalidate(ctx)
    tenant_id, key = auth.create_tenant(ctx, f"dash-{secrets.token_hex(3)}")
    other_key = auth.create_tenant(ctx, f"dash-other-{secrets.token_hex(3)}")[1]
    admin_key = f"iq-admin-{secrets.token_urlsafe(16)}"
    auth.ensure_admin_key(ctx, admin_key)
    yield Own(app, ctx, ctx.redis, tenant_id, key, other_key, admin_key)
    ctx.close()


def running_batch(own: Own, rows: int = 250) -> str:
    """A validated batch (in_progress, shards of 100 rows) whose first shard committed a
    chunk of 50 (48 ok, 2 failed) on worker ``w-test``, started 10 s ago."""
    batch_id = submit_batch(as_key(own.app, own.key), rows)
    service.validate_batch(own.ctx, batch_id)  # the test is the control worker
    with own.ctx.db.session() as s:
        b = s.get(Batch, batch_id)
        assert b is not None and b.status == "in_progress", b.errors
        b.in_progress_at = now() - 10
        first = repo.shards_of(s, batch_id)[0]
    with own.ctx.db.session() as s:
        assert repo.claim_shard(s, first.id, "tok", "w-test", 60) is not None
    with own.ctx.db.session() as s:
        assert repo.checkpoint(s, first.id, "tok", 1, 1, 50, 48, 2, Tokens(prompt=500), 60)
    return batch_id


def test_a_running_batch_with_its_shards_rate_and_eta(own: Own) -> None:
    batch_id = running_batch(own)
    detail = own.get(f"/v1/dashboard/batches/{batch_id}")
    assert set(detail) == {"object", "batch", "shards"}
    b = detail["batch"]
    assert set(b) == BATCH_KEYS
    assert (b["status"], b["endpoint"], b["model"], b["project_id"]) == (
        "in_progress", "/v1/embeddings", MODEL, own.tenant_id)
    assert b["request_counts"] == {"total": 250, "completed": 48, "failed": 2}
    assert b["rate_per_s"] > 0
    assert b["eta_s"] == pytest.approx(200 / b["rate_per_s"], rel=0.01)
    shards = detail["shards"]
    assert all(set(sh) == SHARD_KEYS for sh in shards)
    assert [(sh["index"], sh["rows"]) for sh in shards] == [(0, 100), (1, 100), (2, 50)]
    assert shards[0] == {"index": 0, "status": "running", "rows": 100, "done": 50,
                         "worker": "w-test", "attempts": 1}
    assert [(sh["status"], sh["done"], sh["worker"], sh["attempts"]) for sh in shards[1:]] == [
        ("queued", 0, None, 0), ("queued", 0, None, 0)]

    [listed] = [x for x in own.get("/v1/dashboard/overview")["batches"] if x["id"] == batch_id]
    moving = ("rate_per_s", "eta_s")  # read a moment later
    assert {k: v for k, v in listed.items() if k not in moving} == {
        k: v for k, v in b.items() if k not in moving}
    assert own.get(f"/v1/dashboard/batches/{batch_id}", own.admin_key)["batch"]["id"] == batch_id
    resp = as_key(own.app, own.other_key).get(f"/v1/dashboard/batches/{batch_id}")
    assert resp.status_code == 404
    assert batch_id not in [x["id"] for x in own.get("/v1/dashboard/overview",
                                                     own.other_key)["batches"]]


def test_a_batch_that_stopped_running_has_no_rate(own: Own) -> None:
    batch_id = running_batch(own)
    service.cancel_batch(own.ctx, own.tenant_id, batch_id)
    b = own.get(f"/v1/dashboard/batches/{batch_id}")["batch"]
    assert b["status"] == "cancelling" and b["rate_per_s"] is None and b["eta_s"] is None
    shards = own.get(f"/v1/dashboard/batches/{batch_id}")["shards"]
    assert [sh["status"] for sh in shards] == ["running", "cancelled", "cancelled"]


def test_queue_depths_and_workers_come_from_redis(own: Own) -> None:
    heartbeats.write(own.r, "w-dash@host", {
        "name": "w-dash@host", "lanes": ["realtime", "batch"], "models": [MODEL],
        "breaker": "open", "metrics_url": "http://127.0.0.1:9/metrics", "at": time.time()}, 30)
    heartbeats.write(own.r, "control@host", {"name": "control@host", "lanes": ["control"],
                                               "models": [], "metrics_url": None,
                                               "at": time.time()}, 30)
    own.r.lpush(redis_keys.realtime_queue("other-model"), b"a", b"b")
    body = own.get("/v1/dashboard/overview", own.admin_key)
    lanes = {(x["lane"], x["model"]): x["queue_depth"] for x in body["lanes"]}
    assert lanes[("realtime", "other-model")] == 2
    assert ("realtime", MODEL) not in lanes  # its breaker is open: not a live realtime worker
    assert {("jobs", None), ("control", None), ("batch", None), ("flex", None)} <= set(lanes)
    assert [x["lane"] for x in body["lanes"]][0] == "realtime"
    workers = {w["name"]: w for w in body["workers"]}
    assert set(workers) == {"w-dash@host", "control@host"}
    w = workers["w-dash@host"]
    assert set(w) == {"name", "lanes", "models", "breaker", "metrics_url", "seen_s_ago"}
    assert (w["lanes"], w["models"], w["breaker"]) == (["batch", "realtime"], [MODEL], "open")
    assert 0 <= w["seen_s_ago"] < 30
    assert workers["control@host"]["breaker"] == "closed"
    assert workers["control@host"]["metrics_url"] is None


def test_a_lanes_depth_counts_celery_messages_of_every_priority(own: Own) -> None:
    """kombu keeps a Celery queue in one Redis list per priority step
    (``redis_keys.celery_lists``); the flex lane's depth counts them all."""
    celery = make_celery(own.ctx.settings)
    for priority in (0, 3, 6, 9, 9):
        celery.send_task("inferq.nothing", args=["x"], queue="flex", priority=priority)
    lists = redis_keys.celery_lists("flex")
    assert [own.r.llen(k) for k in lists] == [1, 1, 1, 2]
    body = own.get("/v1/dashboard/overview", own.admin_key)
    lanes = {(x["lane"], x["model"]): x["queue_depth"] for x in body["lanes"]}
    assert lanes[("flex", None)] == 5

def test_latencies_recorded_by_workers_are_read_back_per_minute(own: Own) -> None:
    rec = stats.Recorder()
    flusher = stats.Flusher(rec, own.r, every_s=0.05)
    flusher.start()
    for v in [0.02] * 9 + [3.0]:
        rec.observe(stats.TTFT, "realtime", MODEL, v)
    rec.observe(stats.QUEUE, "realtime", MODEL, 0.004)
    rec.observe(stats.QUEUE, "realtime", "other-model", 0.004)  # one series per lane
    rec.observe(stats.QUEUE, "batch", MODEL, 1.5)
    flusher.stop()  # writes what is left
    series = own.get("/v1/dashboard/overview?window=600")["latency"]["series"]
    assert [(s["lane"], s["metric"]) for s in series] == [
        ("realtime", "ttft"), ("realtime", "queue"), ("batch", "queue")]
    ttft = series[0]
    assert set(ttft) == {"lane", "metric", "points", "summary"}
    assert len(ttft["points"]) == 1
    pt = ttft["points"][0]
    assert set(pt) == {"t", "count", "p50", "p99"} and pt["t"] % 60 == 0
    assert pt["count"] == 10
    assert pt["p50"] == pytest.approx(0.01 + 0.015 * 5 / 9, abs=1e-6)  # rank 5 of 9 in b2
    assert pt["p99"] == pytest.approx(2.5 + 2.5 * 0.9, abs=1e-6)  # rank 9.9: the one in b9
    assert series[1]["points"][0]["count"] == 2
    assert [s["window_s"] for s in ttft["summary"]] == [300, 3600]
    assert all(s["count"] == 10 and s["rate_per_s"] > 0 for s in ttft["summary"])


def test_the_history_keeps_each_minute_apart(own: Own) -> None:
    t0 = 1_800_000_000.0  # a minute's start
    clock = [t0 + 5]
    rec = stats.Recorder(clock=lambda: clock[0])
    rec.enabled = True
    rec.observe(stats.TTFT, "realtime", MODEL, 0.2)
    clock[0] = t0 + 185  # three minutes later
    rec.observe(stats.TTFT, "realtime", MODEL, 0.2)
    rec.observe(stats.TTFT, "realtime", MODEL, 0.2)
    assert rec.write(own.r) == 3
    keys = sorted(k.decode() for k in own.r.scan_iter(match=stats.PREFIX + "ttft:*"))
    assert keys == [f"{stats.PREFIX}ttft:realtime:{MODEL}:{int(t0)}",
                    f"{stats.PREFIX}ttft:realtime:{MODEL}:{int(t0) + 180}"]
    assert 0 < own.r.ttl(keys[0]) <= stats.RETENTION_S + stats.STEP_S

    [s] = stats.history(own.r, 60, now=t0 + 190)  # the last minute only
    assert [(p.t, p.count) for p in s.points] == [(int(t0) + 180, 2)]
    five, hour = s.summaries
    assert (five.window_s, five.count) == (300, 3)
    assert five.rate_per_s == pytest.approx(3 / 250, abs=1e-3)  # since t0 - 60, 5 minutes
    assert hour.count == 3
    [s] = stats.history(own.r, 600, now=t0 + 190)
    assert [(p.t, p.count) for p in s.points] == [(int(t0), 1), (int(t0) + 180, 2)]
    assert stats.history(own.r, 60, now=t0 + stats.RETENTION_S + 600) == []  # past retention
