"""Admission control of the realtime lane from a queueing model; the arithmetic of the
capacity planner (``inferq capacity``) and of the realtime lane's scaling signal
(``inferq_desired_workers{lane="realtime"}``; the batch lanes' is ``jobs.slo.backlog``).

The model is M/G/c: Poisson arrivals, c servers, service times of any spread. Each
live worker holding a model is one or more servers
(``servers``: 1 for the embedding engine, whose forward passes run one at a time;
the realtime row cap for the generation engine, where each running sequence holds a
row of the decode batch), each serving at rate μ: the requests a worker answered in
its last ``INFERQ_ADMISSION_SERVICE_WINDOW_S`` divided by the engine time they took
(``ServiceMeter``, reported in the worker's heartbeat). For embeddings that is each
request's share of the forward passes that computed it, so μ is the batched rate the
engine reaches at the load it sees; for generation it is the wall time a sequence
held its row, steps shared with batch work included (the occupancy the lane shares).

- **Stationary** (Erlang C with Allen–Cunneen's correction): with arrival rate λ,
  offered load a = λ/μ and c servers, a request waits with probability C(c, a) and
  P(W > t) = C(c, a)·e^{-(cμ-λ)t/k}, k = (1 + Cs²)/2, where Cs² is the squared
  coefficient of variation of the service times (variance ÷ mean², measured by the
  workers beside μ). With exponential service (Cs² = 1) this is M/M/c exactly; service
  times less variable than that (a fixed cost per pass plus a part growing with the
  input: Cs² of 0.1 to 0.5 here) wait less, and M/M/c would over-predict their tail
  by up to 1/k. The planner and ``inferq_desired_workers`` use this with λ measured by
  the API: arrivals per model over a sliding window in Redis, shared by every API
  process.
- **Given the state a request arrives in** (the admission decision): with n requests
  in the system (admitted, not yet answered; counted in Redis by the API) a new one
  waits for nothing when n < c, otherwise for n - c + 1 departures at rate cμ: an
  Erlang (gamma) distributed wait. Its p-th percentile plus the request's own first
  service (measured by the workers: for embeddings its share of the passes, its own
  departure; for generation its prefill step) is the predicted time to first token; when
  that exceeds ``INFERQ_REALTIME_TTFT_SLO_S`` the request is answered 503
  ``overloaded`` at once, with a ``retry-after`` of the time the system needs, at its
  departure rate cμ, to get back to an admissible state (at least 1 s). Averaged over
  the stationary distribution of n this is Erlang C's tail; deciding on the state
  instead of the average keeps the engine busy (the admitted queue never drains below
  what the SLO allows) and reacts at once to a burst.

Only the realtime lane is refused this way: jobs and batches wait in their queues.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError

from jobs.core import redis_keys
from jobs.core.errors import InferqError
from jobs.core.schema import new_id
from jobs.fleet.heartbeats import Heartbeat, live_workers
from jobs.slo import backlog

LANE = "realtime"
ARRIVALS, INFLIGHT = redis_keys.ARRIVALS, redis_keys.INFLIGHT
VIEW_TTL_S = 1.0  # an API process reads the workers' heartbeats at most this often

DECISIONS = Counter("inferq_admission_decisions", "Admission decisions of the realtime lane",
                    ["lane", "model", "decision"])
ADMITTED, REJECTED, UNMEASURED = "admitted", "rejected", "unmeasured"


class Overloaded(InferqError):
    """503: the request would miss the lane's latency objective if it were queued."""

    status = 503
    type = "server_error"
    code = "overloaded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)})
        self.retry_after = retry_after


# The M/M/c model ----------------------------------------------------------------------------

def erlang_b(c: int, a: float) -> float:
    """Erlang B (blocking probability of c servers at offered load a), by the stable
    recursion B(k) = a·B(k-1) / (k + a·B(k-1))."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c(c: int, a: float) -> float:
    """Erlang C: the probability that an arrival waits, c servers at offered load a =
    λ/μ; 1 when the system is not stable (a ≥ c)."""
    if c <= 0 or a >= c:
        return 1.0
    if a <= 0:
        return 0.0
    b = erlang_b(c, a)
    return c * b / (c - a * (1 - b))


def _spread(scv: float) -> float:
    """Allen–Cunneen's factor for Poisson arrivals (Ca² = 1): (Ca² + Cs²) / 2."""
    return (1.0 + max(scv, 0.0)) / 2


def wait_tail(t: float, c: int, lam: float, mu: float, scv: float = 1.0) -> float:
    """P(W > t) in the stationary M/G/c queue whose service times have squared
    coefficient of variation ``scv`` (1: exponential, M/M/c exactly)."""
    if lam >= c * mu:
        return 1.0
    return erlang_c(c, lam / mu) * math.exp(-(c * mu - lam) * t / _spread(scv))


def wait_percentile(p: float, c: int, lam: float, mu: float, scv: float = 1.0) -> float:
    """The p-th percentile of the stationary wait (0 when fewer than 1-p wait at all;
    infinite when λ ≥ cμ)."""
    if lam <= 0:
        return 0.0
    if lam >= c * mu:
        return math.inf
    pc = erlang_c(c, lam / mu)
    if pc <= 1 - p:
        return 0.0
    return math.log(pc / (1 - p)) * _spread(scv) / (c * mu - lam)


def mean_wait(c: int, lam: float, mu: float, scv: float = 1.0) -> float:
    if lam >= c * mu:
        return math.inf
    return erlang_c(c, lam / mu) * _spread(scv) / (c * mu - lam)


def servers_needed(lam: float, mu: float, budget_s: float, p: float,
                   limit: int = 100_000, scv: float = 1.0) -> int:
    """The fewest servers whose stationary p-th percentile wait is within ``budget_s``."""
    c = max(1, math.floor(lam / mu) + 1)
    while c < limit and wait_percentile(p, c, lam, mu, scv) > budget_s:
        c += 1
    return c


@functools.lru_cache(maxsize=1024)
def phases_within(x: float, p: float) -> int:
    """The most exponential phases k (each of rate 1) whose sum stays within ``x`` with
    probability ≥ p: the largest k with P(Gamma(k, 1) > x) ≤ 1 - p, which is
    P(Poisson(x) ≤ k - 1) ≤ 1 - p. 0 when even one phase is too many."""
    if x <= 0:
        return 0
    log_pmf = -x
    log_cdf = log_pmf
    limit = math.log(1 - p)
    k = 0
    bound = int(x + 40 * math.sqrt(x) + 100)
    while log_cdf <= limit and k < bound:
        k += 1
        log_pmf += math.log(x) - math.log(k)
        log_cdf = max(log_cdf, log_pmf) + math.log1p(math.exp(-abs(log_cdf - log_pmf)))
    return k


def wait_given(n: int, c: int, mu: float, p: float) -> float:
    """The p-th percentile wait of an arrival that finds ``n`` in the system: 0 when a
    server is free, else the percentile of n - c + 1 departures at rate cμ."""
    if n < c:
        return 0.0
    k = n - c + 1
    lo, hi = 0.0, float(k + 40 * math.sqrt(k) + 100)
    for _ in range(60):  # bisection on x = cμt: phases_within(x) ≥ k
        mid = (lo + hi) / 2
        if phases_within(mid, p) >= k:
            hi = mid
        else:
            lo = mid
    return hi / (c * mu)


def admissible(c: int, mu: float, budget_s: float, p: float) -> int:
    """The most requests in the system at which one more still meets the objective (its
    p-th percentile wait within ``budget_s``): c - 1 + the phases that fit."""
    return c - 1 + phases_within(round(c * mu * budget_s, 6), p)


def retry_after_s(n: int, c: int, mu: float, budget_s: float, p: float) -> int:
    """Seconds until a system holding ``n`` drains, at its departure rate cμ, to a state
    that admits a request again; at least 1."""
    excess = n - admissible(c, mu, budget_s, p)
    return max(1, math.ceil(excess / (c * mu)))


# What the workers report ----------------------------------------------------------------------

class ServiceMeter:
    """A worker's service measurements per model over the last ``window_s``: each
    answered realtime request's engine time (``busy_s``) and the service until its
    first answer (``first_s``). ``snapshot()`` is what the heartbeat announces."""

    def __init__(self, window_s: float = 30.0, maxlen: int = 20_000) -> None:
        self.window_s = window_s
        self.maxlen = maxlen
        self._seen: dict[str, deque[tuple[float, float, float]]] = {}
        self._servers: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, model: str, busy_s: float, first_s: float, servers: int = 1) -> None:
        with self._lock:
            self._seen.setdefault(model, deque(maxlen=self.maxlen)).append(
                (time.monotonic(), busy_s, first_s))
            self._servers[model] = servers

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per model: ``rate`` (μ, requests/s per server while busy), ``scv`` (the
        squared coefficient of variation of the service times), ``first_s`` (the mean
        service until a first answer), ``servers`` and the ``requests`` measured."""
        cut = time.monotonic() - self.window_s
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for model, seen in self._seen.items():
                while seen and seen[0][0] < cut:
                    seen.popleft()
                busy = sum(b for _, b, _ in seen)
                if not seen or busy <= 0:
                    continue
                mean = busy / len(seen)
                var = sum((b - mean) ** 2 for _, b, _ in seen) / len(seen)
                out[model] = {"rate": len(seen) / busy, "servers": self._servers[model],
                              "scv": var / mean ** 2 if len(seen) > 1 else 1.0,
                              "first_s": sum(f for _, _, f in seen) / len(seen),
                              "requests": len(seen)}
        return out


@dataclass(frozen=True)
class Servers:
    """A model's servers on the lane, from the live workers' heartbeats."""

    workers: int  # live workers holding the model
    servers_per_worker: float  # mean over the workers
    mu: float | None  # requests/s per server; None until some worker measured it
    first_s: float  # the mean service until a first answer
    scv: float = 1.0  # the service times' squared coefficient of variation

    @property
    def c(self) -> int:
        return max(1, round(self.workers * self.servers_per_worker))


def servers_of(heartbeats: list[Heartbeat], model: str) -> Servers:
    """Combine the live workers' ``service`` reports for ``model``: μ weighted by the
    requests each measured (workers not yet measured are counted as servers at that μ)."""
    measured = [h["service"][model] for h in heartbeats
                if isinstance(h.get("service"), dict) and model in h["service"]]
    n = sum(m["requests"] for m in measured)
    if not measured or n <= 0:
        return Servers(len(heartbeats), 1.0, None, 0.0)
    mu = sum(m["rate"] * m["requests"] for m in measured) / n
    first = sum(m["first_s"] * m["requests"] for m in measured) / n
    per = sum(m["servers"] for m in measured) / len(measured)
    scv = sum(float(m.get("scv", 1.0)) * m["requests"] for m in measured) / n
    return Servers(len(heartbeats), per, mu, first, scv)


# The API side: arrivals, requests in the system, the decision ----------------------------------

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


# The scaling signal ------------------------------------------------------------------------

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


def policy_of(settings: Any) -> Policy:
    """The lane's admission policy from Settings."""
    return Policy(settings.realtime_ttft_slo_s, settings.realtime_slo_percentile,
                  settings.admission_window_s, settings.admission_hold_s)


def admit(ctx: Any, model: str) -> Ticket:
    """Admission of one realtime request for ``model`` in an API process (``ctx``: its
    Context). Arrivals and requests in the system are counted with or without an
    objective: they feed ``inferq_desired_workers`` too."""
    return decide(ctx.redis, policy_of(ctx.settings), model)


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
