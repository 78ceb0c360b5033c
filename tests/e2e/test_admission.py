"""Admission control of the realtime lane on a real Redis and PostgreSQL: a request
that would miss the time-to-first-token objective is answered 503 ``overloaded`` with
a retry-after while jobs are still accepted; the arrivals and the requests in the
system are one count for every API process; a real worker measures its service rate
and announces it in its heartbeat; ``inferq capacity`` plans from it, and its errors
are one line.

The in-process API apps here get their answers from this test, which plays the
worker on a Redis DB of its own (as tests/integration/test_realtime_transport.py
does): its heartbeat announces a measured service rate, and it holds or answers the
requests it pops."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.request import Request, urlopen

import orjson
import pytest
import redis as redis_lib
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.fleet import builtin_models, heartbeats
from jobs.slo import admission, queueing
from jobs.tenants import auth

MODEL = "all-MiniLM-L6-v2"
# μ = 20/s, a first step of 50 ms, objective 0.5 s at p99: the wait budget 0.45 s holds
# x = cμ·0.45 = 9 departures' worth of time; waiting for k departures fits at p99 while
# P(Poisson(9) ≤ k - 1) ≤ 1 %: P(≤ 2) = 0.6 % but P(≤ 3) = 2.1 %, so k ≤ 3 and an
# arrival may find at most 3 requests in the system.
SERVICE = {MODEL: {"rate": 20.0, "servers": 1, "first_s": 0.05, "requests": 200}}
ADMISSIBLE = 3
TOKEN = "admission-metrics-token"  # the metrics token of the apps made here


def beat(r: redis_lib.Redis, name: str = "test-worker",
         service_info: dict[str, Any] | None = None) -> None:
    heartbeats.write(r, name, {"name": name, "lanes": ["realtime", "jobs"],
                                 "models": [MODEL], "service": service_info or {}}, 60)
    admission.forget()


@pytest.fixture
def env(own_settings: Settings) -> Iterator[dict[str, Any]]:
    st = own_settings.model_copy(update={"realtime_ttft_slo_s": 0.5, "metrics_token": TOKEN,
                                         "realtime_slo_percentile": 0.99,
                                         "admission_window_s": 30})
    ctx = Context(st)
    builtin_models.register_builtin_models(ctx)
    _, key = auth.create_tenant(ctx, "admission")
    r = redis_lib.Redis.from_url(st.redis_url)
    beat(r, service_info=SERVICE)
    yield {"settings": st, "ctx": ctx, "key": key, "r": r}
    r.close()
    ctx.close()


def client_of(app: Any, key: str) -> Any:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return c


def embed(app: Any, key: str) -> Any:
    return client_of(app, key).post("/v1/embeddings", json={"model": MODEL, "input": "hi"})


def answer_all(r: redis_lib.Redis, expect: int, timeout: float = 10) -> int:
    """Play the worker: answer ``expect`` queued embeddings requests."""
    done, deadline = 0, time.monotonic() + timeout
    while done < expect and time.monotonic() < deadline:
        got = r.brpop([redis_keys.realtime_queue(MODEL)], timeout=1)
        if got is None:
            continue
        rid = orjson.loads(got[1])["id"]
        body = {"object": "list", "model": MODEL,
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.5]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        r.lpush(redis_keys.reply(rid), orjson.dumps({"body": body}))
        done += 1
    return done


def hold(app: Any, key: str, n: int) -> tuple[list[threading.Thread], list[Any]]:
    """``n`` embeddings requests in flight (nobody answers them yet)."""
    out: list[Any] = []
    threads = [threading.Thread(target=lambda: out.append(embed(app, key))) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, out


def wait_in_system(r: redis_lib.Redis, n: int, window_s: int) -> None:
    deadline = time.monotonic() + 10
    while admission.lane_state(r, MODEL, window_s).in_system != n:
        assert time.monotonic() < deadline, "the held requests were not counted"
        time.sleep(0.05)


def scrape(app: Any) -> dict[str, list[Any]]:
    got = app.test_client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert got.status_code == 200, got.get_data(as_text=True)
    text = got.get_data(as_text=True)
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def decisions(app: Any, decision: str) -> float:
    fam = scrape(app).get("inferq_admission_decisions", [])
    return sum(s.value for s in fam if s.name.endswith("_total")
               and s.labels == {"lane": "realtime", "model": MODEL, "decision": decision})


def test_overload_is_refused_with_retry_after_while_jobs_are_accepted(env) -> None:  # type: ignore[no-untyped-def]
    from api.app import create_app

    app, r, key = create_app(env["settings"]), env["r"], env["key"]
    rejected_before = decisions(app, admission.REJECTED)
    threads, answers = hold(app, key, ADMISSIBLE + 1)
    wait_in_system(r, ADMISSIBLE + 1, 30)

    refused = embed(app, key)
    assert refused.status_code == 503
    err = refused.get_json()["error"]
    assert err["code"] == "overloaded" and err["type"] == "server_error"
    assert "time-to-first-token" in err["message"]
    assert int(refused.headers["retry-after"]) >= 1
    # The queue the refused request would have joined holds only the admitted ones.
    assert r.llen(redis_keys.realtime_queue(MODEL)) == ADMISSIBLE + 1
    job = client_of(app, key).post("/v1/jobs", json={
        "endpoint": "/v1/embeddings", "body": {"model": MODEL, "input": "a job"}})
    assert job.status_code in (200, 201, 202), job.get_data(as_text=True)  # jobs wait

    assert answer_all(r, ADMISSIBLE + 1) == ADMISSIBLE + 1
    for t in threads:
        t.join(10)
    assert [a.status_code for a in answers] == [200] * (ADMISSIBLE + 1)
    assert admission.lane_state(r, MODEL, 30).in_system == 0  # answered: out of the system

    worker = threading.Thread(target=answer_all, args=(r, 1))
    worker.start()
    assert embed(app, key).status_code == 200  # admitted again once the system drained
    worker.join(10)
    assert decisions(app, admission.REJECTED) == rejected_before + 1


def test_no_objective_refuses_nothing(env) -> None:  # type: ignore[no-untyped-def]
    from api.app import create_app

    st = env["settings"].model_copy(update={"realtime_ttft_slo_s": 0.0})
    app, r, key = create_app(st), env["r"], env["key"]
    threads, answers = hold(app, key, ADMISSIBLE + 3)
    wait_in_system(r, ADMISSIBLE + 3, 30)
    assert answer_all(r, ADMISSIBLE + 3) == ADMISSIBLE + 3
    for t in threads:
        t.join(10)
    assert [a.status_code for a in answers] == [200] * (ADMISSIBLE + 3)


def test_arrivals_and_requests_in_the_system_are_shared_by_api_processes(env) -> None:  # type: ignore[no-untyped-def]
    """Two app instances (two API processes' worth of state): one count of arrivals,
    one of requests in the system, so B refuses what A's requests fill."""
    from api.app import create_app

    a, b, r, key = create_app(env["settings"]), create_app(env["settings"]), env["r"], env["key"]
    before = admission.lane_state(r, MODEL, 30).arrivals
    threads, answers = hold(a, key, ADMISSIBLE + 1)
    wait_in_system(r, ADMISSIBLE + 1, 30)
    refused = embed(b, key)
    assert refused.status_code == 503 and refused.get_json()["error"]["code"] == "overloaded"
    answer_all(r, ADMISSIBLE + 1)
    for t in threads:
        t.join(10)
    worker = threading.Thread(target=answer_all, args=(r, 2))
    worker.start()
    assert embed(b, key).status_code == 200 and embed(a, key).status_code == 200
    worker.join(10)
    state = admission.lane_state(r, MODEL, 30)
    assert state.arrivals == before + ADMISSIBLE + 1 + 1 + 2  # refused ones are arrivals too
    assert state.rate == pytest.approx(state.arrivals / 30, rel=0.1)
    assert [x.status_code for x in answers] == [200] * (ADMISSIBLE + 1)


def test_desired_workers_on_metrics(env) -> None:  # type: ignore[no-untyped-def]
    """At λ = 40/s with μ = 20/s per worker the lane needs more than 2 workers (ρ < 1)
    and as many as the stationary p99 wait within 0.45 s asks for."""
    from api.app import create_app

    r = env["r"]
    now = int(r.time()[0])
    key = admission._keys(admission.LANE, MODEL)[0]
    r.hset(key, mapping={str(now - i): 40 for i in range(30)})  # 40/s over the window
    app = create_app(env["settings"])
    fam = scrape(app)["inferq_desired_workers"]
    got = {s.labels["lane"]: s.value for s in fam}
    lam = admission.lane_state(r, MODEL, 30).rate
    want = queueing.servers_needed(lam, 20.0, 0.45, 0.99)
    assert got == {"realtime": want, "batch": 0, "flex": 0} and want >= 3  # no batches
    assert queueing.wait_percentile(0.99, want, lam, 20.0) <= 0.45


def run_cli(args: list[str], settings: Settings, **env: str) -> Any:
    from cli.main import main

    base = {"INFERQ_DATA_DIR": str(settings.data_dir / "no-stack"), "INFERQ_REDIS_URL": "",
            "INFERQ_DATABASE_URL": "", "INFERQ_OBJECT_STORE_URL": ""}
    return CliRunner().invoke(main, args, env={**base, **env})


def test_capacity_with_a_given_service_time(env) -> None:  # type: ignore[no-untyped-def]
    res = run_cli(["capacity", "--lane", "realtime", "--rate", "40", "--slo", "0.5",
                   "--service-time", "0.04"], env["settings"])
    assert res.exit_code == 0, res.output
    assert "workers needed: 2 " in res.output
    p99 = queueing.wait_percentile(0.99, 2, 40, 25)
    assert f"p99 {p99:.3f} s" in res.output
    assert math.isinf(queueing.wait_percentile(0.99, 1, 40, 25))  # 1 worker: unstable


def test_capacity_with_the_spread_of_service_times(env) -> None:  # type: ignore[no-untyped-def]
    """Service times less variable than exponential wait less (M/G/c): fewer workers."""
    args = ["capacity", "--lane", "realtime", "--rate", "60", "--slo", "0.06",
            "--service-time", "0.04"]
    exp = run_cli(args, env["settings"])
    low = run_cli([*args, "--service-scv", "0.1"], env["settings"])
    assert exp.exit_code == 0 and low.exit_code == 0, (exp.output, low.output)
    want_exp = queueing.servers_needed(60, 25, 0.06, 0.99)
    want_low = queueing.servers_needed(60, 25, 0.06, 0.99, scv=0.1)
    assert want_low < want_exp
    assert f"workers needed: {want_exp} " in exp.output
    assert f"workers needed: {want_low} " in low.output
    assert "squared coefficient of variation 0.10" in low.output
    p99 = queueing.wait_percentile(0.99, want_low, 60, 25, 0.1)
    assert f"p99 {p99:.3f} s" in low.output


def test_capacity_from_the_live_workers(env) -> None:  # type: ignore[no-untyped-def]
    st = env["settings"]
    res = run_cli(["capacity", "--lane", "realtime", "--rate", "40", "--slo", "0.45"], st,
                  INFERQ_REDIS_URL=st.redis_url)
    assert res.exit_code == 0, res.output
    want = queueing.servers_needed(40, 20.0, 0.45, 0.99)
    assert "measured by 1 live worker(s)" in res.output and "50.00 ms per request" in res.output
    assert f"workers needed: {want} " in res.output


def test_capacity_errors_are_one_line(env) -> None:  # type: ignore[no-untyped-def]
    st = env["settings"]
    cases = [
        (["--lane", "batch", "--rate", "1", "--slo", "1", "--service-time", "1"], {}, 2),
        (["--lane", "realtime", "--rate", "0", "--slo", "1", "--service-time", "1"], {}, 2),
        (["--lane", "realtime", "--rate", "1", "--slo", "1"], {}, 1),  # no stack to measure
        (["--lane", "realtime", "--rate", "1", "--slo", "1", "--model", "other"],
         {"INFERQ_REDIS_URL": st.redis_url}, 1),  # no worker holds it
        (["--lane", "realtime", "--rate", "1", "--slo", "1", "--percentile", "1.5",
          "--service-time", "1"], {}, 2),
    ]
    for args, extra, code in cases:
        res = run_cli(["capacity", *args], st, **extra)
        assert res.exit_code == code, (args, res.output)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    beat(env["r"], service_info={})  # alive, nothing measured yet
    res = run_cli(["capacity", "--lane", "realtime", "--rate", "1", "--slo", "1"], st,
                  INFERQ_REDIS_URL=st.redis_url)
    assert res.exit_code == 1 and "has measured" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_real_worker_measures_its_service_rate(fstack, fsdk, workers) -> None:  # type: ignore[no-untyped-def]
    """A model worker times the realtime requests it answers and announces μ in its
    heartbeat; the API's scaling signal and `inferq capacity` read it from there."""
    workers("adm", "realtime")
    r = redis_lib.Redis.from_url(fstack.settings.redis_url)
    deadline = time.monotonic() + 120
    while not heartbeats.live_workers(r, "realtime", MODEL):
        assert time.monotonic() < deadline, "the worker did not come up"
        time.sleep(0.5)
    sent = 12
    for i in range(sent):
        fsdk.embeddings.create(model=MODEL, input=f"measure the service of request {i}",
                               encoding_format="float")
    measured: dict[str, Any] = {}
    while time.monotonic() < deadline:
        for h in heartbeats.live_workers(r, "realtime", MODEL):
            measured = h.get("service", {}).get(MODEL, {})
        if measured.get("requests", 0) >= sent:
            break
        time.sleep(0.5)
    assert measured["requests"] == sent and measured["servers"] == 1
    assert measured["rate"] > 0 and 0 < measured["first_s"] < 30 and measured["scv"] >= 0
    # An embeddings request's first answer is its own departure: first_s is 1/μ.
    assert measured["rate"] * measured["first_s"] == pytest.approx(1.0)
    res = run_cli(["capacity", "--lane", "realtime", "--rate", "1", "--slo", "1"],
                  fstack.settings, INFERQ_REDIS_URL=fstack.settings.redis_url)
    assert res.exit_code == 0 and "measured by 1 live worker(s)" in res.output, res.output
    with urlopen(Request(fstack.base_url + "/metrics", headers={
            "Authorization": f"Bearer {fstack.settings.metrics_token}"})) as resp:
        text = resp.read().decode()
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    desired = {s.labels["lane"]: s.value for s in fams["inferq_desired_workers"]}
    assert desired["realtime"] == 1.0  # 12 requests: 1 will do
    admitted = [s.value for s in fams["inferq_admission_decisions"] if s.name.endswith("_total")
                and s.labels["model"] == MODEL]
    assert sum(admitted) >= sent
    r.close()
