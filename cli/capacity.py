"""``inferq capacity``: how many workers a lane needs. The realtime lane: for an
arrival rate and a wait objective, by the queueing model the scaling signal uses
(``jobs.slo.queueing``: M/G/c, Erlang C with Allen–Cunneen's correction for the spread of
service times). The batch lanes: for a backlog of rows and its deadline, at the rows
per second a worker computes (``jobs.slo.backlog``, the batch lanes' scaling signal).

The service time and its spread are the ones given, or the ones the stack's live
workers measured (their heartbeats' service reports, as the API reads them).
"""

from __future__ import annotations

import math

import click

from cli import state
from jobs.core.lanes import SHARD_LANES
from jobs.core.settings import Settings
from jobs.slo import admission, queueing, service_rates


def _fmt(s: float) -> str:
    return "∞" if math.isinf(s) else f"{s:.3f} s"


def _measured(model: str) -> service_rates.Servers:
    """The model's servers on the realtime lane of this data dir's stack."""
    import redis

    st = state.resolve(Settings.from_env())
    if not st.redis_url:
        raise click.ClickException(
            f"no inferq stack runs on data dir {st.data_dir} to measure the service time: "
            "give --service-time, start a stack with `inferq up`, or set INFERQ_REDIS_URL")
    r = redis.Redis.from_url(st.redis_url, socket_connect_timeout=3, socket_timeout=5)
    try:
        from jobs.fleet.heartbeats import live_workers

        beats = live_workers(r, admission.LANE, model)
    except redis.RedisError as e:
        raise click.ClickException(f"cannot read the workers' heartbeats from Redis "
                                   f"({st.redis_url}): {e}") from None
    finally:
        r.close()
    view = service_rates.servers_of(beats, model)
    if not beats:
        raise click.ClickException(f"no live worker serves {model} on the realtime lane: "
                                   "start one, or give --service-time")
    if view.mu is None:
        raise click.ClickException(
            f"no live worker has measured {model} yet (within INFERQ_ADMISSION_SERVICE_"
            "WINDOW_S): send it some realtime requests, or give --service-time")
    return view


def _batch_plan(lane: str, model: str, rows: int | None, deadline: float | None,
                rows_per_s: float | None) -> None:
    """``--lane batch|flex``: the workers that compute ``rows`` within ``deadline``
    seconds (or, without them, the stack's backlog on the lane before its batches'
    deadlines), at ``rows_per_s`` per worker or the rate the stack's shards measured."""
    import time

    from jobs.core.context import Context
    from jobs.slo import backlog

    if (rows is None) != (deadline is None):
        raise click.UsageError("give --rows and --deadline together (or neither: the "
                               "stack's backlog on the lane)")
    measured: dict[str, backlog.Rate] = {}
    due: list[backlog.Due] = []
    now = time.time()
    if rows_per_s is None or rows is None:
        st = state.resolve(Settings.from_env())
        if not st.database_url:
            raise click.ClickException(
                f"no inferq stack runs on data dir {st.data_dir} to read the {lane} lane "
                "from: give --rows, --deadline and --rows-per-s, start a stack with "
                "`inferq up`, or set INFERQ_DATABASE_URL")
        ctx = Context(st)
        try:
            with ctx.db.session() as s:
                measured = backlog.measured_rates(s, lane)
                due = backlog.backlog(s, lane, now) if rows is None else []
        finally:
            ctx.close()
    if rows is not None and deadline is not None:
        due = [backlog.Due(model, rows, now + deadline)]
    rates = {m: r.per_s for m, r in measured.items()}
    if rows_per_s is not None:
        rates = {d.model: rows_per_s for d in due} or {model: rows_per_s}
    missing = sorted({d.model for d in due if d.model not in rates})
    if missing:
        raise click.ClickException(
            f"no shard of {', '.join(missing)} on the {lane} lane has committed yet, so its "
            "rows per second are not measured: give --rows-per-s")
    if not due:
        click.echo(f"{lane} lane: no rows wait before a deadline; workers needed: 0")
        return
    for m in sorted({d.model for d in due}):
        how = "given" if rows_per_s is not None else (
            f"measured: {measured[m].rows} rows in {measured[m].seconds:.0f} s of shard "
            "attempts")
        click.echo(f"{lane} lane, {m}: {rates[m]:.3g} rows/s per worker ({how})")
    for d in sorted(due, key=lambda d: d.deadline or float("inf")):
        left = "no deadline" if d.deadline is None else f"due in {d.deadline - now:,.0f} s"
        click.echo(f"  {d.rows:>12,} rows of {d.model}, {left}: "
                   f"{d.rows / rates[d.model]:,.0f} worker-seconds")
    n = backlog.workers_needed(due, rates, 1.0, now)
    click.echo(f"workers needed: {n} (each deadline met, earliest first)")


@click.command()
@click.option("--lane", type=click.Choice([admission.LANE, *SHARD_LANES]), required=True,
              help="the lane to plan: realtime (a latency objective), or batch / flex (a "
                   "backlog of rows and its deadline)")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="realtime: arrivals per second")
@click.option("--slo", type=click.FloatRange(min=0, min_open=True), default=None,
              help="realtime: the wait objective in seconds, at --percentile")
@click.option("--rows", type=click.IntRange(min=1), default=None,
              help="batch/flex: rows to compute (default: the stack's backlog on the lane)")
@click.option("--deadline", type=click.FloatRange(min=0, min_open=True), default=None,
              help="batch/flex: seconds from now by which --rows must be done")
@click.option("--rows-per-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="batch/flex: rows one worker computes per second (default: measured on "
                   "the stack's shards of the model)")
@click.option("--service-time", type=click.FloatRange(min=0, min_open=True), default=None,
              help="seconds a worker takes per request (default: measured by the stack's "
                   "live workers)")
@click.option("--service-scv", type=click.FloatRange(min=0), default=None,
              help="the service times' squared coefficient of variation (variance ÷ "
                   "mean²; 1: exponential, 0: constant). Default: measured by the live "
                   "workers, or 1 with --service-time")
@click.option("--model", default=None, help="the model (default: INFERQ_EMBEDDING_MODEL)")
@click.option("--percentile", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None, help="default: INFERQ_REALTIME_SLO_PERCENTILE (0.99)")
def capacity(lane: str, rate: float | None, slo: float | None, rows: int | None,
             deadline: float | None, rows_per_s: float | None, service_time: float | None,
             service_scv: float | None, model: str | None, percentile: float | None) -> None:
    """Workers needed on the realtime LANE for RATE arrivals/s with the PERCENTILE wait
    within SLO seconds, with the predicted p50/p99 wait (M/G/c: Erlang C,
    Allen–Cunneen); on the batch or flex lane, for ROWS within DEADLINE seconds (or
    the stack's backlog before its batches' deadlines) at the rows per second a worker
    computes."""
    st = Settings.from_env()
    model = model or st.embedding_model
    realtime_only = {"--rate": rate, "--slo": slo, "--service-time": service_time,
                     "--service-scv": service_scv, "--percentile": percentile}
    batch_only = {"--rows": rows, "--deadline": deadline, "--rows-per-s": rows_per_s}
    if lane != admission.LANE:
        wrong = [k for k, v in realtime_only.items() if v is not None]
        if wrong:
            raise click.UsageError(f"{', '.join(wrong)}: for --lane realtime only")
        _batch_plan(lane, model, rows, deadline, rows_per_s)
        return
    wrong = [k for k, v in batch_only.items() if v is not None]
    if wrong:
        raise click.UsageError(f"{', '.join(wrong)}: for --lane batch or flex only")
    if rate is None or slo is None:
        raise click.UsageError("--lane realtime needs --rate and --slo")
    p = percentile or st.realtime_slo_percentile
    if service_time is not None:
        mu, per, scv, source = 1 / service_time, 1.0, 1.0, "given"
    else:
        view = _measured(model)
        mu, per, scv = view.mu or 0.0, max(view.servers_per_worker, 1.0), view.scv
        source = f"measured by {view.workers} live worker(s)"
    scv = scv if service_scv is None else service_scv

    def wait(q: float, servers: int) -> str:
        return _fmt(queueing.wait_percentile(q, servers, rate, mu, scv))

    servers = queueing.servers_needed(rate, mu, slo, p, scv=scv)
    workers = max(1, math.ceil(servers / per))
    c = max(1, round(workers * per))
    click.echo(f"{lane} lane, {model}: {rate:g} requests/s, service time "
               f"{1000 / mu:.2f} ms per request, squared coefficient of variation "
               f"{scv:.2f} ({source}; {per:g} server(s) per worker); "
               f"objective: p{p * 100:g} wait ≤ {slo:g} s")
    extra = p not in (0.5, 0.99)  # a column of its own for another percentile
    click.echo(f"  {'WORKERS':>7} {'UTILISATION':>11} {'P(WAIT)':>8} {'P50 WAIT':>10} "
               f"{'P99 WAIT':>10}" + (f" {f'P{p * 100:g} WAIT':>10}" if extra else ""))
    first = max(1, workers - 2)
    for w in range(first, workers + 2):
        cw = max(1, round(w * per))
        util = rate / (cw * mu)
        pw = queueing.erlang_c(cw, rate / mu)
        mark = " <- needed" if w == workers else ""
        click.echo(f"  {w:>7} {util:>11.3f} {pw:>8.3f} {wait(0.5, cw):>10} "
                   f"{wait(0.99, cw):>10}" + (f" {wait(p, cw):>10}" if extra else "") + mark)
    click.echo(f"workers needed: {workers} (predicted wait p50 {wait(0.5, c)}, "
               f"p99 {wait(0.99, c)})")
