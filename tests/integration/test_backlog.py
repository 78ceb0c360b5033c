"""The batch lanes' scaling signal on a real PostgreSQL: the rows waiting and running in
each lane's shards, the rows per second per worker measured on the shards' committed
rows, and ``inferq_desired_workers{lane="batch"|"flex"}`` on the API's /metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.core.context import Context
from jobs.core.schema import Batch, File, Shard, new_id
from jobs.core.settings import Settings
from jobs.core.status import BatchStatus, ShardStatus
from jobs.slo import backlog, scaling
from jobs.tenants import auth

MODEL = "all-MiniLM-L6-v2"
TOKEN = "backlog-metrics-token"
DEFAULT_RATE = 2.0  # rows/s per worker before a model is measured


@pytest.fixture
def bctx(own_settings: Settings) -> Iterator[Context]:
    """A database of its own: the signal sums every batch it finds."""
    c = Context(own_settings.model_copy(update={"batch_rows_per_s": DEFAULT_RATE,
                                                "metrics_token": TOKEN}))
    yield c
    c.close()


def add_batch(ctx: Context, tenant_id: str, shards: list[dict[str, Any]],
              **batch: Any) -> str:
    with ctx.db.session() as s:
        f = File(id=new_id("file-"), tenant_id=tenant_id, filename="in.jsonl", purpose="batch",
                 format="jsonl", bytes=1, object_key="x")
        b = Batch(id=new_id("batch_"), tenant_id=tenant_id, endpoint="/v1/embeddings",
                  input_file_id=f.id, completion_window="24h", model=MODEL,
                  **{"status": BatchStatus.IN_PROGRESS, **batch})
        s.add(f)
        s.flush()
        s.add(b)
        s.flush()
        for i, kw in enumerate(shards):
            s.add(Shard(id=f"{b.id}.{i:06d}", batch_id=b.id, index=i, object_key="x",
                        dispatched_at=time.time(), **{"rows": 1000, **kw}))
        return b.id


def queued(rows: int = 1000) -> dict[str, Any]:
    return {"rows": rows, "status": ShardStatus.QUEUED}


def ran(t: float, rows_done: int, started_s_ago: float, committed_s_ago: float,
        status: ShardStatus = ShardStatus.RUNNING, **kw: Any) -> dict[str, Any]:
    """A shard whose current attempt claimed it ``started_s_ago`` and last committed
    ``committed_s_ago`` (its ``updated_at``)."""
    return {"status": status, "rows_done": rows_done, "chunks_done": max(1, rows_done // 250),
            "claimed_chunks": 0, "attempt": 1, "claimed_at": t - started_s_ago,
            "updated_at": t - committed_s_ago, **kw}


@pytest.fixture
def fleet(bctx: Context) -> dict[str, Any]:
    """Batches on both lanes, with the rows, rates and deadlines the tests count on.

    batch lane, all-MiniLM-L6-v2, measured: 1,000 rows in 50 s (a done shard) and 500
    in 25 s (a running one): 1,500 rows in 75 s, 20 rows/s per worker.
    - A, due in 1,000 s: 500 left of the running shard, 1,000 queued, 300 left of a
      shard resumed from its checkpoint (its attempt did not start at row 0: not a
      measurement): 1,800 rows, 90 worker-seconds.
    - B, due in 100 s: 5,000 rows queued, 250 worker-seconds: 2.5 workers.
    flex lane, the same model, not measured on that lane: the default 2 rows/s.
    - C, due in 600 s: 3,000 rows queued, 1,500 worker-seconds: 2.5 workers.
    Left out: a cancelling batch, one past its deadline, a finished batch's shards
    (a rate ten times higher), a shard that failed, a shard cancelled."""
    ctx, t = bctx, time.time()
    tenant_id, _ = auth.create_tenant(ctx, "backlog")
    a = add_batch(ctx, tenant_id, [
        ran(t, 1000, 100, 50, ShardStatus.DONE),
        ran(t, 500, 40, 15),
        queued(),
        ran(t, 700, 10, 5, claimed_chunks=2, chunks_done=3, attempt=2),
        {"status": ShardStatus.FAILED, "rows_done": 0},
        {"status": ShardStatus.CANCELLED, "rows_done": 0},
    ], expires_at=int(t) + 1000)
    b = add_batch(ctx, tenant_id, [queued(2500), queued(2500)], expires_at=int(t) + 100)
    c = add_batch(ctx, tenant_id, [queued(1500), queued(1500)], expires_at=int(t) + 600,
                  service_tier="flex")
    add_batch(ctx, tenant_id, [queued(9000)], expires_at=int(t) + 100,
              status=BatchStatus.CANCELLING)
    add_batch(ctx, tenant_id, [queued(9000)], expires_at=int(t) - 1)
    add_batch(ctx, tenant_id, [ran(t, 1000, 10, 5, ShardStatus.DONE)],
              expires_at=int(t) + 1000, status=BatchStatus.COMPLETED)
    return {"t": t, "a": a, "b": b, "c": c}


def test_rows_rates_and_deadlines_give_the_workers(bctx: Context,
                                                   fleet: dict[str, Any]) -> None:
    t = fleet["t"]
    with bctx.db.session() as s:
        rates = backlog.measured_rates(s, "batch")
        assert rates == {MODEL: backlog.Rate(1500, pytest.approx(75.0))}
        assert rates[MODEL].per_s == pytest.approx(20.0)
        assert backlog.measured_rates(s, "flex") == {}
        due = sorted(backlog.backlog(s, "batch", t), key=lambda d: d.rows)
        assert [(d.model, d.rows, d.deadline) for d in due] == [
            (MODEL, 1800, float(int(t) + 1000)), (MODEL, 5000, float(int(t) + 100))]
        assert [(d.rows, d.deadline) for d in backlog.backlog(s, "flex", t)] == [
            (3000, float(int(t) + 600))]
        batch = backlog.desired_workers(s, "batch", DEFAULT_RATE, now=t)
        flex = backlog.desired_workers(s, "flex", DEFAULT_RATE, now=t)
    # B: 250 worker-seconds in 100 s: 3 workers (A's 90 more by 1,000 s need only 1)
    assert batch.workers == 3
    # C at the default rate: 1,500 worker-seconds in 600 s: 3 workers
    assert flex.workers == 3
    assert backlog.desired(bctx) == {"batch": 3, "flex": 3}


def test_the_signal_follows_the_work(bctx: Context, fleet: dict[str, Any]) -> None:
    """B finished: A alone (90 worker-seconds over 1,000 s) needs one worker. A flex
    shard committing 500 rows in 50 s replaces the default rate with 10 rows/s: the
    2,500 rows left take 250 worker-seconds over 600 s, one worker instead of three.
    A lane with nothing left in progress needs none."""
    t = fleet["t"]
    with bctx.db.session() as s:
        s.query(Shard).filter(Shard.batch_id == fleet["b"]).update(
            {"status": ShardStatus.DONE, "rows_done": Shard.rows})
        s.query(Shard).filter(Shard.id == f"{fleet['c']}.000000").update(
            ran(t, 500, 60, 10))
    assert backlog.desired(bctx) == {"batch": 1, "flex": 1}
    with bctx.db.session() as s:
        s.query(Batch).filter(Batch.id.in_([fleet["a"], fleet["c"]])).update(
            {"status": BatchStatus.FINALIZING})
    assert backlog.desired(bctx) == {"batch": 0, "flex": 0}


def scrape(app: Any) -> dict[str, float]:
    got = app.test_client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert got.status_code == 200, got.get_data(as_text=True)
    fams = {f.name: f.samples for f in text_string_to_metric_families(got.get_data(as_text=True))}
    return {s.labels["lane"]: s.value for s in fams["inferq_desired_workers"]}


def test_desired_workers_of_the_batch_lanes_on_metrics(bctx: Context,
                                                       fleet: dict[str, Any]) -> None:
    from api.app import create_app

    app = create_app(bctx.settings)
    assert scrape(app) == {"realtime": 0.0, "batch": 3.0, "flex": 3.0}


def test_the_batch_lanes_are_left_out_while_the_database_is_away(bctx: Context) -> None:
    away = Context(bctx.settings.model_copy(update={
        "database_url": "postgresql+psycopg://nobody@127.0.0.1:1/none"}))
    try:
        collector = scaling.collector(away)
        samples = [(s.labels["lane"], s.value) for fam in collector.collect()
                   for s in fam.samples]
    finally:
        away.close()
    assert samples == [("realtime", 0.0)]


def run_capacity(bctx: Context, *args: str, database: bool = True) -> Any:
    from click.testing import CliRunner

    from cli.main import main

    env = {"INFERQ_DATA_DIR": str(bctx.settings.data_dir / "no-stack"), "INFERQ_REDIS_URL": "",
           "INFERQ_DATABASE_URL": bctx.settings.database_url if database else "",
           "INFERQ_OBJECT_STORE_URL": ""}
    return CliRunner().invoke(main, ["capacity", *args], env=env)


def test_capacity_plans_the_backlog_and_a_backlog_of_your_own(
        bctx: Context, fleet: dict[str, Any]) -> None:
    """``inferq capacity --lane batch``: the stack's backlog at the measured rate (the
    signal's 3 workers, each batch's worker-seconds shown); ``--rows --deadline`` a
    backlog of one's own, at the measured rate or ``--rows-per-s``."""
    res = run_capacity(bctx, "--lane", "batch")
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert out[0] == (f"batch lane, {MODEL}: 20 rows/s per worker (measured: 1500 rows in "
                      "75 s of shard attempts)")
    assert "5,000 rows of" in out[1] and "250 worker-seconds" in out[1]  # due first
    assert "1,800 rows of" in out[2] and "90 worker-seconds" in out[2]
    assert out[-1] == "workers needed: 3 (each deadline met, earliest first)"
    # 36,000 rows at the measured 20 rows/s: 1,800 worker-seconds in 600 s
    res = run_capacity(bctx, "--lane", "batch", "--rows", "36000", "--deadline", "600")
    assert res.output.splitlines()[-1].startswith("workers needed: 3 "), res.output
    res = run_capacity(bctx, "--lane", "flex", "--rows", "36000", "--deadline", "600",
                       "--rows-per-s", "5", database=False)
    assert res.exit_code == 0 and "5 rows/s per worker (given)" in res.output, res.output
    assert res.output.splitlines()[-1].startswith("workers needed: 12 ")


def test_capacity_errors_on_the_batch_lanes_are_one_line(bctx: Context,
                                                         fleet: dict[str, Any]) -> None:
    cases = [
        (["--lane", "flex"], True, 1, "not measured: give --rows-per-s"),
        (["--lane", "batch", "--rows", "10"], True, 2, "--rows and --deadline together"),
        (["--lane", "batch", "--rows", "10", "--deadline", "5"], False, 1, "inferq up"),
        (["--lane", "batch", "--rate", "3"], True, 2, "--rate: for --lane realtime only"),
        (["--lane", "realtime", "--rate", "1", "--slo", "1", "--rows", "3"], True, 2,
         "--rows: for --lane batch or flex only"),
        (["--lane", "batch", "--rows", "0", "--deadline", "5"], True, 2, "--rows"),
    ]
    for args, database, code, words in cases:
        res = run_capacity(bctx, *args, database=database)
        lines = res.output.strip().splitlines()
        assert res.exit_code == code, (args, res.output)
        assert lines[-1].startswith("Error: ") and words in lines[-1], (args, res.output)
        assert "Traceback" not in res.output
