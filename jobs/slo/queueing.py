"""The queueing model of the realtime lane, M/G/c: the arithmetic of its admission
control (``jobs.slo.admission``), of the capacity planner (``inferq capacity``) and of
its scaling signal (``jobs.slo.scaling``).

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
"""

from __future__ import annotations

import functools
import math


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
