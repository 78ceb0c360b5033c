"""The realtime lane's scaling signal, ``inferq_desired_workers{lane="realtime"}``: the
workers each of its models needs to meet the lane's latency objective at the measured
arrival and service rates, computed at scrape time for an autoscaler (the batch lanes'
signal is ``jobs.slo.backlog``'s)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError

from jobs.fleet.heartbeats import live_workers
from jobs.slo import backlog
from jobs.slo.admission import ARRIVALS, LANE, lane_state, servers
from jobs.slo.queueing import servers_needed
from jobs.slo.service_rates import Servers


@dataclass(frozen=True)
class Desired:
    model: str
    workers: int
    rate: float
    view: Servers
    in_system: int


def desired_workers(r: redis.Redis, model: str, slo_s: float, percentile: float,
                    window_s: int) -> Desired:
    """The workers ``model`` needs on the lane: the fewest whose stationary p-th
    percentile wait at the measured λ and μ fits the objective (less the service until
    a first answer), and enough to clear the requests already in the system within it. Without a
    measured μ: the live workers (at least 1 while requests arrive)."""
    state = lane_state(r, model, window_s)
    view = servers(r, model)
    if view.mu is None:
        return Desired(model, max(view.workers, 1 if state.rate > 0 else 0), state.rate, view,
                       state.in_system)
    budget = max(slo_s - view.first_s, 1e-3)
    per = max(view.servers_per_worker, 1.0)
    c = (servers_needed(state.rate, view.mu, budget, percentile, scv=view.scv)
         if state.rate > 0 else 0)
    backlog = math.ceil(state.in_system / (view.mu * budget))
    return Desired(model, max(1, math.ceil(max(c, backlog) / per)), state.rate, view,
                   state.in_system)


class DesiredWorkersCollector:
    """``inferq_desired_workers{lane}`` computed at scrape time, for an autoscaler (KEDA's
    Prometheus scaler in docker/k8s/): for the realtime lane the most any of its models
    needs; for the batch lanes what ``batch_lanes`` says (``jobs.slo.backlog``). A lane whose
    backend cannot be read (Redis, the database) is left out rather than reported
    wrong."""

    def __init__(self, redis_of: Callable[[], redis.Redis], models: Callable[[], list[str]],
                 slo_s: float, percentile: float, window_s: int,
                 batch_lanes: Callable[[], dict[str, int]] | None = None) -> None:
        self.redis_of, self.models = redis_of, models
        self.slo_s, self.percentile, self.window_s = slo_s, percentile, window_s
        self.batch_lanes = batch_lanes

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("inferq_desired_workers",
                              "Workers the lane needs: realtime to meet its latency "
                              "objective at the measured arrival and service rates; "
                              "batch and flex to finish their rows before their "
                              "batches' deadlines at the measured rows per second",
                              labels=["lane"])
        try:
            r = self.redis_of()
            want = [desired_workers(r, m, self.slo_s, self.percentile, self.window_s).workers
                    for m in self.models()]
            g.add_metric([LANE], max(want, default=0))
        except redis.RedisError:
            pass
        if self.batch_lanes is not None:
            try:
                lanes = self.batch_lanes()
            except SQLAlchemyError:
                lanes = {}
            for lane, n in lanes.items():
                g.add_metric([lane], n)
        if g.samples:
            yield g

    def describe(self) -> list[Metric]:
        return []


def lane_models(r: redis.Redis) -> list[str]:
    """The models of the realtime lane: those its live workers hold and those requests
    arrived for within the window (a model no worker holds needs workers too)."""
    names = {m for h in live_workers(r, LANE) for m in h.get("models", [])}
    prefix = f"{ARRIVALS}{LANE}:"
    for k in r.scan_iter(match=prefix + "*", count=200):
        names.add((k.decode() if isinstance(k, bytes) else str(k))[len(prefix):])
    return sorted(names)


def collector(ctx: Any) -> DesiredWorkersCollector:
    """The scaling signal of an API process (``ctx``: its Context)."""
    st = ctx.settings
    return DesiredWorkersCollector(lambda: ctx.redis, lambda: lane_models(ctx.redis),
                                   st.realtime_ttft_slo_s or st.first_token_timeout_s,
                                   st.realtime_slo_percentile, st.admission_window_s,
                                   lambda: backlog.desired(ctx))
