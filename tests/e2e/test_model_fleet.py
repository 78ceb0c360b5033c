"""Many models and versions on one fleet (``fstack``: API, control worker, a database of
its own; model workers on the simulated accelerator, each holding its own versions
within a memory budget of two):

- requests, jobs and batch rows of each model are served only by the workers that
  hold it (the workers' own counters), and nothing is loaded that was not planned;
- a version nobody holds is loaded once, on the least-loaded worker with room, and a
  full worker evicts its least recently used version;
- a canary gets its weight of 1,000 requests, a rollback stops it within a second, a
  batch validated before a promotion finishes on its pinned version;
- a shadow's agreement and latency are reported per version.

The models are test-own names for the packaged all-MiniLM-L6-v2's files (the
simulated accelerator reads their tokenizer, never their weights)."""

from __future__ import annotations

import secrets
import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import pytest
import redis as redis_lib
from sqlalchemy import delete

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet import catalog, placement, registry, shadow
from jobs.fleet.heartbeats import live_workers
from tests.helpers import emb_line, jsonl, upload, wait
from tests.polling import until

pytestmark = pytest.mark.slow

SFX = secrets.token_hex(3)
A, B, C, D, E = (f"fleet-{x}-{SFX}" for x in "abcde")
SIM = {"INFERQ_ACCELERATOR": "simulated", "INFERQ_SIMULATED_PROFILE": "h100-minilm",
       "INFERQ_WORKER_HEARTBEAT_S": "1"}
LANES = "realtime,jobs,batch"


@pytest.fixture(scope="module")
def fleet(fstack: Any) -> Iterator[dict[str, Any]]:
    """The test's models (A in versions 1 and 2), a budget of two of them per worker,
    and an admin client; everything removed afterwards."""
    ctx = Context(fstack.settings)
    base = registry.get_default(ctx, "all-MiniLM-L6-v2")
    assert base is not None
    for name in (A, B, C, D, E):
        registry.register(ctx, name, "1", "embeddings", "test: all-MiniLM-L6-v2's files",
                          base.files, base.context_length, object_prefix=base.object_prefix)
    registry.register(ctx, A, "2", "embeddings", "test: all-MiniLM-L6-v2's files",
                      base.files, base.context_length, object_prefix=base.object_prefix,
                      default="keep")
    size_mb = registry.total_bytes(base) / (1 << 20)
    admin = httpx2.Client(base_url=fstack.base_url + "/v1/organization", timeout=30,
                          headers={"Authorization": f"Bearer {fstack.admin_api_key()}"})
    yield {"ctx": ctx, "budget": str(int(size_mb * 2.5)), "admin": admin}
    admin.close()
    with ctx.db.session() as s:
        s.execute(delete(Model).where(Model.name.endswith(SFX)))
    for name in (A, B, C, D, E):
        shadow.reset(ctx.redis, name)
    catalog.invalidate(ctx)
    ctx.close()


def start(fstack: Any, workers: Any, fleet: dict[str, Any], n: int,
          **models: str) -> list[dict[str, Any]]:
    """``n`` workers (``models``: env per worker index, e.g. w0=A), once the lane's
    heartbeats are exactly theirs: earlier tests' workers have been killed, and a
    placement must not pick a worker that is gone."""
    procs = [workers(f"fl{i}-{SFX}", LANES, **SIM, INFERQ_MODEL_MEMORY_MB=fleet["budget"],
                     INFERQ_EMBEDDING_MODEL=models[f"w{i}"],
                     INFERQ_MODELS=models.get(f"extra{i}", "")) for i in range(n)]
    r = fleet["ctx"].redis
    pids = {p.pid for p in procs}
    deadline = time.monotonic() + 120
    while True:
        beats = live_workers(r, "realtime")
        mine = [b for b in beats if _parent(b) in pids]
        if len(mine) == n == len(beats):
            return sorted(mine, key=lambda b: models[f"w{_index(b, procs)}"])
        assert time.monotonic() < deadline, [b["name"] for b in beats]
        time.sleep(0.3)


def _parent(beat: dict[str, Any]) -> int:
    host, _, pid = beat["name"].rpartition(":")
    if host != socket.gethostname():
        return -1
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def _index(beat: dict[str, Any], procs: list[Any]) -> int:
    return next(i for i, p in enumerate(procs) if p.pid == _parent(beat))


def beat(r: redis_lib.Redis, name: str) -> dict[str, Any]:  # type: ignore[type-arg]
    got = [b for b in live_workers(r, "realtime") if b["name"] == name]
    assert got, f"{name} has no heartbeat"
    return got[0]


def served(r: redis_lib.Redis, name: str) -> dict[str, int]:  # type: ignore[type-arg]
    return {m["ref"]: m["served"] for m in beat(r, name)["residency"]["models"]}


def embed(sdk: Any, model: str, text: str) -> str:
    """One realtime request; the version that answered (its header)."""
    raw = sdk.embeddings.with_raw_response.create(model=model, input=text,
                                                  encoding_format="float")
    assert raw.parse().model == model
    assert 0 <= float(raw.headers["inferq-queue-ms"]) < 60_000  # its wait for an engine
    return str(raw.headers["inferq-model-version"])


def test_each_model_is_served_only_where_it_is_resident(fstack: Any, fsdk: Any, workers: Any,
                                                        fleet: dict[str, Any]) -> None:
    r = fleet["ctx"].redis
    wa, wb = start(fstack, workers, fleet, 2, w0=A, w1=B)
    assert (wa["resident"], wb["resident"]) == ([f"{A}@1"], [f"{B}@1"])
    for model in (A, B):
        for i in range(20):
            assert embed(fsdk, model, f"realtime {i}") == "1"
    jobs = [fsdk.post("/jobs", cast_to=object, body={
        "endpoint": "/v1/embeddings", "body": {"model": m, "input": f"job {i}"}})
        for m in (A, B) for i in range(3)]
    batches = [fsdk.batches.create(
        input_file_id=upload(fsdk, jsonl([emb_line(i, f"row {i}", model=m)
                                          for i in range(30)])).id,
        endpoint="/v1/embeddings", completion_window="24h") for m in (A, B)]
    for b in batches:
        done = wait(fsdk, b.id, timeout=120)
        assert (done.status, done.request_counts.completed) == ("completed", 30), done
        assert done.model_version == "1"  # type: ignore[attr-defined]
    for j in jobs:
        until(lambda j=j: fsdk.get(f"/jobs/{j['id']}", cast_to=object)["status"]
              == "completed")
    # 20 requests + 3 jobs + 30 batch rows each, every one on the worker holding it.
    until(lambda: served(r, wa["name"]) == {f"{A}@1": 53}
          and served(r, wb["name"]) == {f"{B}@1": 53}, timeout=20)
    for w in (wa, wb):
        assert beat(r, w["name"])["residency"]["loads"] == {"configured": 1}
    loads = placement.load_counts(r)
    assert all(set(loads.get(f"{m}@1", {})) <= {"configured"} for m in (A, B)), loads


def test_a_version_nobody_holds_is_loaded_once_where_there_is_room(
        fstack: Any, fsdk: Any, workers: Any, fleet: dict[str, Any]) -> None:
    r = fleet["ctx"].redis
    wa, wb = start(fstack, workers, fleet, 2, w0=A, w1=B)
    with ThreadPoolExecutor(8) as pool:  # at once: still one placement
        assert set(pool.map(lambda i: embed(fsdk, C, f"cold {i}"), range(8))) == {"1"}
    holders = until(lambda: placement.where(r).get(f"{C}@1"))
    assert len(holders) == 1
    first = holders[0]
    other = wb["name"] if first == wa["name"] else wa["name"]
    assert placement.load_counts(r)[f"{C}@1"] == {"placement": 1}

    assert embed(fsdk, D, "cold") == "1"  # the worker holding C is full: the other
    assert until(lambda: placement.where(r).get(f"{D}@1")) == [other]
    assert all(beat(r, w)["residency"]["unloads"] == {} for w in (first, other))
    # Use every version again, C and B last: A and D are each worker's least recent.
    for m in (A, D, B, C):
        embed(fsdk, m, "warm")
    assert embed(fsdk, E, "cold") == "1"  # both full: one evicts its LRU version
    holder = until(lambda: placement.where(r).get(f"{E}@1"))
    assert len(holder) == 1 and placement.load_counts(r)[f"{E}@1"] == {"placement": 1}
    # Its least recently used: on wa A (used before D or C), on wb D or B (before C).
    lru = {wa["name"]: f"{A}@1",
           wb["name"]: f"{B}@1" if first == wb["name"] else f"{D}@1"}
    evicted = lru[holder[0]]
    res = beat(r, holder[0])["residency"]
    assert res["unloads"] == {"evicted": 1}
    refs = {m["ref"] for m in res["models"]}
    assert len(refs) == 2 and f"{E}@1" in refs and evicted not in refs
    assert evicted not in placement.where(r)

    # A batch for the evicted version: placed again, its shard consumed from the
    # version's own queue once the worker holds it.
    name = evicted.split("@")[0]
    placed_before = placement.load_counts(r).get(evicted, {}).get("placement", 0)
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(
        [emb_line(i, f"placed {i}", model=name) for i in range(10)])).id,
        endpoint="/v1/embeddings", completion_window="24h")
    done = wait(fsdk, b.id, timeout=120)
    assert (done.status, done.request_counts.completed) == ("completed", 10), done
    assert placement.load_counts(r)[evicted].get("placement", 0) == placed_before + 1
    until(lambda: evicted in placement.where(r))  # from its next heartbeat


def test_a_canary_its_rollback_a_pinned_batch_and_a_shadow(
        fstack: Any, fsdk: Any, workers: Any, fleet: dict[str, Any]) -> None:
    r, admin = fleet["ctx"].redis, fleet["admin"]
    wa, wb = start(fstack, workers, fleet, 2, w0=A, w1=B, extra1=f"{A}@2")
    assert set(wb["resident"]) == {f"{A}@2", f"{B}@1"}
    step = admin.post(f"/models/{A}/rollout", json={"version": "2", "weight": 0.05})
    assert step.status_code == 200, step.text
    assert {v["version"]: v["traffic_weight"] for v in step.json()["versions"]} == {
        "1": 0.95, "2": 0.05}
    before = served(r, wb["name"]).get(f"{A}@2", 0)
    with ThreadPoolExecutor(8) as pool:
        got = Counter(pool.map(lambda i: embed(fsdk, A, f"canary {i}"), range(1000)))
    assert abs(got["2"] - 50) <= 30 and got["1"] + got["2"] == 1000, got
    jobs = [fsdk.post("/jobs", cast_to=object, body={
        "endpoint": "/v1/embeddings", "body": {"model": A, "input": f"job {i}"}})
        for i in range(100)]  # jobs take the canary's share too
    to_canary = sum(j["model_version"] == "2" for j in jobs)
    assert abs(to_canary - 5) <= 1 and {j["model_version"] for j in jobs} == {"1", "2"}
    for j in jobs:
        until(lambda j=j: fsdk.get(f"/jobs/{j['id']}", cast_to=object)["status"]
              == "completed")
    until(lambda: served(r, wb["name"]).get(f"{A}@2", 0) - before == got["2"] + to_canary,
          timeout=30)

    t0 = time.monotonic()
    assert admin.post(f"/models/{A}/rollout",
                      json={"action": "rollback", "version": "2"}).status_code == 200
    late = []
    while time.monotonic() - t0 < 2.0:
        sent = time.monotonic() - t0
        if embed(fsdk, A, f"after {sent}") == "2":
            late.append(sent)
    assert not late or max(late) < 1.0, late

    rows = 1200  # three shards, validated (pinned) before the promotion
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(
        [emb_line(i, f"pinned {i}", model=A) for i in range(rows)])).id,
        endpoint="/v1/embeddings", completion_window="24h")
    until(lambda: fsdk.batches.retrieve(b.id).status in ("in_progress", "completed"))
    v1 = served(r, wa["name"])[f"{A}@1"]
    v2 = served(r, wb["name"])[f"{A}@2"]
    step = admin.post(f"/models/{A}/rollout", json={"version": "2", "action": "promote"})
    assert step.status_code == 200, step.text
    done = wait(fsdk, b.id, timeout=180)
    assert done.status == "completed" and done.request_counts.completed == rows
    assert done.model_version == "1"  # type: ignore[attr-defined]
    # (more when a shard's lease lapsed under load and rows were computed again)
    until(lambda: served(r, wa["name"])[f"{A}@1"] - v1 >= rows, timeout=20)
    assert served(r, wb["name"])[f"{A}@2"] == v2  # nothing of the batch ran on 2
    assert embed(fsdk, A, "promoted") == "2"

    assert admin.post(f"/models/{A}/rollout",
                      json={"version": "1", "shadow": 1.0}).status_code == 200
    for i in range(30):
        assert embed(fsdk, A, f"shadowed {i}") == "2"
    report = until(lambda: [x for x in admin.get(f"/models/{A}/rollout").json()["shadow"]
                            if x["version"] == "1" and x["shadow"] == 30])
    assert report[0]["agreement"] == pytest.approx(1.0, abs=1e-6)
    assert report[0]["errors"] == 0 and report[0]["latency_p99_s"] > 0
    primary = [x for x in admin.get(f"/models/{A}/rollout").json()["shadow"]
               if x["version"] == "2"]
    assert primary[0]["primary"] == 30 and primary[0]["latency_p50_s"] > 0


def test_rollout_steps_that_do_not_hold_together_are_400(fleet: dict[str, Any]) -> None:
    admin = fleet["admin"]
    for body, needle in (({"version": "1", "weight": 0.5}, "is the default"),
                         ({"version": "9", "weight": 0.5}, "has no version '9'"),
                         ({"version": "1", "weight": 1.5}, "less than or equal to 1"),
                         ({"version": "1"}, "give one step"),
                         ({"weight": 0.1}, "a version is required"),
                         ({"version": "1", "weight": 0.1, "action": "promote"}, "one step"),
                         ({"bogus": 1}, "bogus")):
        got = admin.post(f"/models/{B}/rollout", json=body)
        assert got.status_code == 400, (body, got.text)
        assert needle in got.json()["error"]["message"], (body, got.text)
    hostile = (b'{"version": "1\\u0000", "weight": 0.5}', b'{"version": "1", "weight": 1e999}',
               b'{"version": "1", "weight": NaN}', b"[1, 2]", b"null", b"{" * 5000,
               b'{"version": "' + b"9" * 100_000 + b'", "weight": 0.1}', b"\xff\xfe")
    for raw in hostile:
        got = admin.post(f"/models/{B}/rollout", content=raw,
                         headers={"Content-Type": "application/json"})
        assert got.status_code in (400, 413), (raw[:40], got.text)
        assert set(got.json()["error"]) == {"message", "type", "param", "code"}
    for body in ({"min_resident": 10**30}, {"min_resident": 1.5}, {"idle_unload_s": "1"},
                 {"idle_unload_s": 0}, {"min_resident": True}):
        got = admin.post(f"/models/{B}/versions/1/pool", json=body)
        assert got.status_code == 400, (body, got.text)
    assert admin.post(f"/models/{B}%00/rollout", json={}).status_code == 404
    missing = admin.post("/models/no-such-model/rollout", json={"action": "rollback"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    bad_pool = admin.post(f"/models/{A}/versions/1/pool", json={"min_resident": -1})
    assert bad_pool.status_code == 400


def test_warm_pools_keep_their_copies_and_unload_idle_extras(
        fstack: Any, fsdk: Any, workers: Any, fleet: dict[str, Any]) -> None:
    r, admin = fleet["ctx"].redis, fleet["admin"]
    wa, wb = start(fstack, workers, fleet, 2, w0=A, w1=B)
    got = admin.post(f"/models/{C}/versions/1/pool", json={"min_resident": 2})
    assert got.status_code == 200, got.text
    assert until(lambda: sorted(placement.where(r).get(f"{C}@1", [])) == sorted(
        [wa["name"], wb["name"]]))
    assert placement.load_counts(r)[f"{C}@1"].get("warm_pool", 0) >= 2
    # One worker goes (SIGKILL: scale-in, or a crash) and another comes: the pool is
    # made whole again on the newcomer.
    gone = next(p for name, p in fstack.procs.items() if name == f"worker-fl1-{SFX}")
    gone.kill()
    gone.wait()
    until(lambda: wb["name"] not in {b["name"] for b in live_workers(r, "realtime")})
    assert placement.where(r).get(f"{C}@1") == [wa["name"]]
    new = workers(f"fl2-{SFX}", LANES, **SIM, INFERQ_MODEL_MEMORY_MB=fleet["budget"],
                  INFERQ_EMBEDDING_MODEL=D)
    until(lambda: len(placement.where(r).get(f"{C}@1", [])) == 2, timeout=90)
    assert any(_parent(b) == new.pid for b in live_workers(r, "realtime")
               if f"{C}@1" in b["resident"])

    # Idle extras: D's only copy, unused for 2 s, goes; C stays at its minimum.
    got = admin.post(f"/models/{D}/versions/1/pool", json={"idle_unload_s": 2})
    assert got.status_code == 200 and got.json()["versions"][0]["idle_unload_s"] == 2
    until(lambda: f"{D}@1" not in placement.where(r), timeout=30)
    assert len(placement.where(r)[f"{C}@1"]) == 2
    assert embed(fsdk, D, "back again") == "1"  # placed again on request
    kept = admin.post(f"/models/{C}/versions/1/pool", json={"min_resident": 0,
                                                            "idle_unload_s": None})
    assert kept.json()["versions"][0] == {**kept.json()["versions"][0], "min_resident": 0,
                                          "idle_unload_s": None}
