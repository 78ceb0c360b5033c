"""The queueing model of admission control: Erlang C against textbook values, the
waiting-time tail and its percentiles, the state-given wait, retry-after, and the
service measurements workers report."""

from __future__ import annotations

import math

import pytest

from jobs.slo import queueing, service_rates


@pytest.mark.parametrize(("c", "a", "expected"), [
    (1, 0.5, 0.5),  # M/M/1: P(wait) = ρ
    (2, 1.0, 1 / 3),
    (5, 4.0, 0.5541),  # Erlang C tables
    (10, 8.0, 0.4092),
])
def test_erlang_c_matches_tables(c: int, a: float, expected: float) -> None:
    assert queueing.erlang_c(c, a) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize(("c", "a"), [(3, 2.0), (20, 15.0), (50, 45.0), (7, 0.3)])
def test_erlang_c_matches_the_direct_formula(c: int, a: float) -> None:
    top = a ** c / math.factorial(c) * c / (c - a)
    direct = top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)
    assert queueing.erlang_c(c, a) == pytest.approx(direct, rel=1e-9)


def test_erlang_c_edges() -> None:
    assert queueing.erlang_c(3, 0.0) == 0.0
    assert queueing.erlang_c(3, 3.0) == 1.0  # not stable: everyone waits
    assert queueing.erlang_c(0, 1.0) == 1.0


def test_mm1_tail_and_percentile_closed_form() -> None:
    lam, mu = 8.0, 10.0  # ρ = 0.8: P(W > t) = ρ e^{-(μ-λ)t}
    assert queueing.wait_tail(0.5, 1, lam, mu) == pytest.approx(0.8 * math.exp(-1.0))
    assert queueing.wait_percentile(0.99, 1, lam, mu) == pytest.approx(math.log(80) / 2)
    assert queueing.wait_percentile(0.5, 1, lam, mu) == pytest.approx(math.log(1.6) / 2)
    assert queueing.wait_percentile(0.1, 1, lam, mu) == 0.0  # 20 % never wait
    assert queueing.wait_percentile(0.99, 1, 10.0, mu) == math.inf
    assert queueing.mean_wait(1, lam, mu) == pytest.approx(0.8 / 2)


def test_percentiles_grow_with_load_and_shrink_with_servers() -> None:
    mu = 5.0
    for c in (1, 2, 4, 8):
        ws = [queueing.wait_percentile(0.99, c, rho * c * mu, mu)
              for rho in (0.3, 0.5, 0.7, 0.9, 0.99)]
        assert ws == sorted(ws) and ws[-1] > ws[0]
        ps = [queueing.wait_percentile(p, c, 0.9 * c * mu, mu) for p in (0.5, 0.9, 0.99, 0.999)]
        assert ps == sorted(ps)
    lam = 18.0
    by_c = [queueing.wait_percentile(0.99, c, lam, mu) for c in range(4, 10)]
    assert by_c == sorted(by_c, reverse=True) and by_c[0] > by_c[-1]


def test_servers_needed_is_the_smallest_that_fits() -> None:
    lam, mu, slo = 50.0, 10.0, 0.2
    c = queueing.servers_needed(lam, mu, slo, 0.99)
    assert queueing.wait_percentile(0.99, c, lam, mu) <= slo
    assert queueing.wait_percentile(0.99, c - 1, lam, mu) > slo
    assert queueing.servers_needed(0.1, 10.0, 1.0, 0.99) == 1


def gamma_sf(k: int, x: float) -> float:
    """P(Gamma(k, 1) > x) by direct summation."""
    term, total = math.exp(-x), 0.0
    for i in range(k):
        total += term
        term *= x / (i + 1)
    return total


@pytest.mark.parametrize("k", [1, 2, 5, 20, 60])
def test_wait_given_state_is_the_erlang_percentile(k: int) -> None:
    c, mu, p = 2, 3.0, 0.99
    t = queueing.wait_given(c - 1 + k, c, mu, p)  # k departures ahead at rate cμ
    assert gamma_sf(k, c * mu * t) == pytest.approx(1 - p, rel=1e-6)
    assert queueing.wait_given(c - 1, c, mu, p) == 0.0  # a free server


def test_state_given_wait_averages_to_erlang_c() -> None:
    """Averaged over the stationary distribution of the number in system, the
    state-given tail is Erlang C's P(W > t) = C e^{-(cμ-λ)t}."""
    c, lam, mu, t = 3, 2.4, 1.0, 0.7
    a = lam / mu
    weights = [a ** n / math.factorial(n) if n < c else
               a ** c / math.factorial(c) * (a / c) ** (n - c) for n in range(300)]
    z = sum(weights)
    avg = sum(w / z * gamma_sf(n - c + 1, c * mu * t) for n, w in enumerate(weights) if n >= c)
    assert avg == pytest.approx(queueing.wait_tail(t, c, lam, mu), rel=1e-6)


def test_admissible_and_retry_after() -> None:
    c, mu, budget, p = 1, 100.0, 0.5, 0.99
    n_max = queueing.admissible(c, mu, budget, p)
    assert queueing.wait_given(n_max, c, mu, p) <= budget < queueing.wait_given(n_max + 1, c, mu, p)
    assert queueing.admissible(2, mu, 0.0, p) == 1  # no time to wait: only a free server
    assert queueing.retry_after_s(n_max + 1, c, mu, budget, p) == 1  # at least 1 s
    # 1,000 too many at 100/s: 10 s to drain
    assert queueing.retry_after_s(n_max + 1000, c, mu, budget, p) == 10
    assert queueing.retry_after_s(n_max + 1000, 4, mu, budget, p) < 10  # more servers, sooner


def test_service_meter_reports_rate_per_busy_second() -> None:
    m = service_rates.ServiceMeter(window_s=60)
    for _ in range(10):
        m.record("e", 0.02, 0.05)
    m.record("g", 2.0, 0.1, servers=64)
    snap = m.snapshot()
    assert snap["e"]["rate"] == pytest.approx(50.0) and snap["e"]["requests"] == 10
    assert snap["e"]["first_s"] == pytest.approx(0.05) and snap["e"]["servers"] == 1
    assert snap["g"]["servers"] == 64 and snap["g"]["rate"] == pytest.approx(0.5)
    assert service_rates.ServiceMeter(window_s=60).snapshot() == {}


def test_servers_of_heartbeats() -> None:
    hb = [{"service": {"e": {"rate": 40.0, "servers": 1, "first_s": 0.02, "requests": 30}}},
          {"service": {"e": {"rate": 60.0, "servers": 1, "first_s": 0.04, "requests": 10}}},
          {"service": {}}]
    v = service_rates.servers_of(hb, "e")
    assert v.workers == 3 and v.c == 3
    assert v.mu == pytest.approx(45.0) and v.first_s == pytest.approx(0.025)
    assert service_rates.servers_of(hb, "other").mu is None


def test_a_stream_reports_the_row_it_held_and_its_first_step() -> None:
    """The realtime lane's stream sink tells the meter how long the sequence held its
    row (start to finish) and its first step (start to first text), with the engine's
    realtime row cap as the servers. Events go to a publisher that is not started (the
    Redis edge is never reached)."""
    import time

    import redis

    from workers.engines.sinks import FinishReason, Usage
    from workers.lanes.realtime_sinks import ServicedSink
    from workers.lanes.streams import CancelListener, Publisher

    r = redis.Redis(host="127.0.0.1", port=1)  # never connected: nothing is sent
    meter = service_rates.ServiceMeter(window_s=60)
    msg = {"id": "req_1", "kind": "/v1/chat/completions", "body": {"model": "chat"}}
    sink = ServicedSink(Publisher(r), msg, CancelListener(r), None, meter)
    sink.servers = 64
    sink.start()
    time.sleep(0.02)
    sink.delta("a")
    time.sleep(0.03)
    sink.delta("b")
    sink.finish(FinishReason.STOP, Usage(3, 2, 1))
    got = meter.snapshot()["chat"]
    assert got["servers"] == 64 and got["requests"] == 1
    assert 0.02 <= got["first_s"] < 0.05 <= 1 / got["rate"] < 1.0


def test_a_stream_whose_client_left_reports_what_it_held() -> None:
    import redis

    from workers.engines.sinks import Usage
    from workers.lanes.realtime_sinks import ServicedSink
    from workers.lanes.streams import CancelListener, Publisher

    r = redis.Redis(host="127.0.0.1", port=1)
    meter = service_rates.ServiceMeter(window_s=60)
    msg = {"id": "req_2", "kind": "/v1/chat/completions", "body": {"model": "chat"}}
    sink = ServicedSink(Publisher(r), msg, CancelListener(r), None, meter)
    sink.abandoned(Usage(3, 0, 1))  # never started: it held no row
    assert meter.snapshot() == {}
    sink.start()
    sink.abandoned(Usage(3, 0, 1))
    assert meter.snapshot()["chat"]["requests"] == 1


def simulated_wait_p99(c: int, rho: float, scv: float, n: int = 120_000,
                       seed: int = 7) -> float:
    """The p99 wait of c first-come-first-served servers (μ = 1) under Poisson arrivals
    at λ = ρc, service times Gamma-distributed with squared coefficient of variation
    ``scv``: Kiefer–Wolfowitz's recursion over the servers' next free times."""
    import heapq
    import random

    rng = random.Random(seed)
    shape = 1 / scv
    free, t, waits = [0.0] * c, 0.0, []
    for _ in range(n):
        t += rng.expovariate(rho * c)
        start = max(t, heapq.heappop(free))
        waits.append(start - t)
        heapq.heappush(free, start + rng.gammavariate(shape, 1 / shape))
    waits = sorted(waits[n // 10:])  # without the warm-up from empty
    return waits[int(0.99 * len(waits))]


@pytest.mark.parametrize("c", [1, 2, 4])
@pytest.mark.parametrize("rho", [0.5, 0.8])
@pytest.mark.parametrize("scv", [0.25, 1.0])
def test_the_model_predicts_a_simulated_queues_p99_wait(c: int, rho: float,
                                                        scv: float) -> None:
    """M/G/c by Allen–Cunneen against the queue itself: within 25 % of the simulated
    p99 wait for service times less variable than exponential and exponential ones;
    M/M/c (scv = 1 assumed) misses the less variable case."""
    measured = simulated_wait_p99(c, rho, scv)
    predicted = queueing.wait_percentile(0.99, c, rho * c, 1.0, scv)
    assert predicted == pytest.approx(measured, rel=0.25)
    if scv < 1:
        assert queueing.wait_percentile(0.99, c, rho * c, 1.0) > 1.3 * measured


def test_service_meter_reports_the_spread_of_service_times() -> None:
    m = service_rates.ServiceMeter(window_s=60)
    for busy in (0.01, 0.03) * 20:  # mean 0.02, standard deviation 0.01
        m.record("e", busy, 0.0)
    assert m.snapshot()["e"]["scv"] == pytest.approx(0.25)
    hb = [{"service": {"e": {"rate": 50.0, "servers": 1, "first_s": 0.0, "requests": 30,
                             "scv": 0.2}}},
          {"service": {"e": {"rate": 50.0, "servers": 1, "first_s": 0.0, "requests": 10}}}]
    assert service_rates.servers_of(hb, "e").scv == pytest.approx((0.2 * 30 + 1.0 * 10) / 40)
