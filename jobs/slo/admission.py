"""Admission control of the realtime lane. Every API process counts the lane's arrivals
and the requests in the system in Redis, and admits a request, or answers it 503
``overloaded`` at once when, given the state it arrives in, its predicted time to first
token exceeds ``INFERQ_REALTIME_TTFT_SLO_S``. The queueing model is
``jobs.slo.queueing``'s; the servers and their rates come from the workers' heartbeats
(``jobs.slo.service_rates``).

Only the realtime lane is refused this way: jobs and batches wait in their queues.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client import Counter

from jobs.core import lanes, redis_keys
from jobs.core.errors import InferqError
from jobs.core.schema import new_id
from jobs.fleet.heartbeats import live_workers
from jobs.slo.queueing import admissible, retry_after_s
from jobs.slo.service_rates import Servers, servers_of

LANE = lanes.REALTIME
ARRIVALS, INFLIGHT = redis_keys.ARRIVALS, redis_keys.INFLIGHT
VIEW_TTL_S = 1.0  # an API process reads the workers' heartbeats at most this often

DECISIONS = Counter("inferq_admission_decisions", "Admission decisions of the realtime lane",
                    ["lane", "model", "decision"])
ADMITTED, REJECTED, UNMEASURED = "admitted", "rejected", "unmeasured"


class Overloaded(InferqError, status=503, type="server_error", code="overloaded"):
    """The request would miss the lane's latency objective if it were queued."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)})
        self.retry_after = retry_after


# Count an arrival (when ARGV[2] is 1) in this second's field, drop fields older than
# the window, and purge lapsed entries of the requests in the system. Returns the
# arrivals in the window, the span it covers (µs), the requests in the system and
# the time (ms).
_STATE = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local w = tonumber(ARGV[1])
if ARGV[2] == '1' then
  redis.call('HINCRBY', KEYS[1], sec, 1)
  redis.call('EXPIRE', KEYS[1], w + 5)
end
local total = 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  if tonumber(fields[i]) <= sec - w then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    total = total + tonumber(fields[i + 1])
  end
end
local now_ms = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
return {total, (w - 1) * 1000000 + tonumber(t[2]), redis.call('ZCARD', KEYS[2]), now_ms}
"""


def _keys(lane: str, model: str) -> list[str]:
    return [f"{ARRIVALS}{lane}:{model}", f"{INFLIGHT}{lane}:{model}"]


@dataclass(frozen=True)
class LaneState:
    arrivals: int  # in the window
    rate: float  # λ: arrivals per second over the window
    in_system: int  # admitted and not answered yet
    now_ms: int = 0  # Redis' clock when read


def lane_state(r: redis.Redis, model: str, window_s: int, record: bool = False,
               lane: str = LANE) -> LaneState:
    """λ and the requests in the system for ``model``, shared by every API process
    (Redis' clock); ``record`` counts one arrival first."""
    got = r.eval(_STATE, 2, *_keys(lane, model), int(window_s), "1" if record else "0")
    total, span_us, n, now_ms = (int(x) for x in got)
    return LaneState(total, total / max(span_us / 1e6, 1e-3), n, now_ms)


_views: dict[tuple[int, str], tuple[float, Servers]] = {}
_views_lock = threading.Lock()


def servers(r: redis.Redis, model: str, lane: str = LANE) -> Servers:
    """The model's servers, from heartbeats read at most every VIEW_TTL_S per process."""
    key, now = (id(r), model), time.monotonic()
    with _views_lock:
        hit = _views.get(key)
    if hit is not None and now - hit[0] < VIEW_TTL_S:
        return hit[1]
    view = servers_of(live_workers(r, lane, model), model)
    with _views_lock:
        _views[key] = (now, view)
    return view


def forget() -> None:
    """Drop the cached views of the heartbeats (tests that change them)."""
    with _views_lock:
        _views.clear()


@dataclass
class Ticket:
    """An admitted request in the system; ``release`` when it is answered (or failed)."""

    r: redis.Redis | None
    key: str
    member: str

    def release(self) -> None:
        if self.r is None:
            return
        r, self.r = self.r, None
        try:
            r.zrem(self.key, self.member)
        except redis.RedisError:
            pass  # the entry lapses on its own


@dataclass(frozen=True)
class Policy:
    slo_s: float  # 0: no objective, nothing refused
    percentile: float
    window_s: int
    hold_s: float  # how long an entry of the requests in the system lives at most


def decide(r: redis.Redis, policy: Policy, model: str) -> Ticket:
    """Count the arrival and admit it (a Ticket) or refuse it (Overloaded)."""
    state = lane_state(r, model, policy.window_s, record=True)
    view = servers(r, model)
    if policy.slo_s > 0 and view.mu is not None and view.workers > 0:
        budget = policy.slo_s - view.first_s
        c = view.c
        if state.in_system > admissible(c, view.mu, budget, policy.percentile):
            retry = retry_after_s(state.in_system, c, view.mu, budget, policy.percentile)
            DECISIONS.labels(LANE, model, REJECTED).inc()
            raise Overloaded(
                f"the realtime lane for {model} is overloaded: {state.in_system} requests "
                f"ahead on {c} server(s) would wait beyond its {policy.slo_s:g} s "
                f"time-to-first-token objective; retry after {retry} s", retry)
    DECISIONS.labels(LANE, model, ADMITTED if view.mu is not None else UNMEASURED).inc()
    key = _keys(LANE, model)[1]
    member = new_id("adm_")
    expiry_ms = state.now_ms + int(policy.hold_s * 1000)
    with r.pipeline() as pipe:
        pipe.zadd(key, {member: expiry_ms})
        pipe.pexpire(key, int(policy.hold_s * 1000) + 5000)
        pipe.execute()
    return Ticket(r, key, member)


def policy_of(settings: Any) -> Policy:
    """The lane's admission policy from Settings."""
    return Policy(settings.realtime_ttft_slo_s, settings.realtime_slo_percentile,
                  settings.admission_window_s, settings.admission_hold_s)


def admit(ctx: Any, model: str) -> Ticket:
    """Admission of one realtime request for ``model`` in an API process (``ctx``: its
    Context). Arrivals and requests in the system are counted with or without an
    objective: they feed ``inferq_desired_workers`` too."""
    return decide(ctx.redis, policy_of(ctx.settings), model)
