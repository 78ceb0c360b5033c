"""The latency history's arithmetic: which bucket an observation falls in, quantiles
interpolated within buckets as Prometheus' histogram_quantile does, and the recorder's
buffer (no Redis here but a closed port: a refused write drops its counts)."""

from __future__ import annotations

import socket

import pytest
import redis

from jobs.slo import stats

N = len(stats.FIELDS)


def hist(**by_bucket: int) -> list[int]:
    """Counts per bucket, named b<index>; ``inf`` is the +Inf bucket."""
    counts = [0] * N
    for name, n in by_bucket.items():
        counts[N - 1 if name == "inf" else int(name[1:])] = n
    return counts


def test_an_observation_goes_in_the_first_bucket_whose_bound_holds_it() -> None:
    assert stats.bucket_of(0.0) == 0
    assert stats.bucket_of(-1.0) == 0  # clock skew between processes: counted as 0
    assert stats.bucket_of(0.005) == 0  # bounds are inclusive (le), as in Prometheus
    assert stats.bucket_of(0.0051) == 1
    assert stats.bucket_of(60.0) == len(stats.BOUNDS) - 1
    assert stats.bucket_of(61.0) == N - 1  # +Inf
    assert stats.FIELDS[0] == "0.005" and stats.FIELDS[-1] == "+Inf"


def test_the_lowest_bucket_starts_at_zero() -> None:
    counts = hist(b0=10)
    assert stats.quantile(0.5, counts) == pytest.approx(0.0025)
    assert stats.quantile(0.99, counts) == pytest.approx(0.00495)


def test_a_quantile_is_interpolated_within_its_bucket() -> None:
    counts = hist(b1=10)  # (0.005, 0.01]
    assert stats.quantile(0.5, counts) == pytest.approx(0.0075)
    counts = hist(b3=50, b6=50)  # (0.025, 0.05] and (0.25, 0.5]
    assert stats.quantile(0.5, counts) == pytest.approx(0.05)  # rank 50: the top of b3
    assert stats.quantile(0.99, counts) == pytest.approx(0.25 + 0.25 * 49 / 50)
    assert stats.quantile(1.0, counts) == pytest.approx(0.5)


def test_empty_buckets_between_are_skipped() -> None:
    counts = hist(b0=1, b9=1)  # (2.5, 5]
    assert stats.quantile(0.99, counts) == pytest.approx(2.5 + 2.5 * 0.98)


def test_a_rank_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert stats.quantile(0.5, hist(inf=3)) == stats.BOUNDS[-1]
    assert stats.quantile(0.99, hist(b0=90, inf=10)) == stats.BOUNDS[-1]
    assert stats.quantile(0.5, hist(b0=90, inf=10)) == pytest.approx(0.005 * 50 / 90)


def test_no_observations_no_quantile() -> None:
    assert stats.quantile(0.5, [0] * N) is None


def test_the_recorder_buffers_by_series_minute_and_bucket() -> None:
    now = [1_000_030.0]
    rec = stats.Recorder(clock=lambda: now[0])
    rec.observe(stats.TTFT, "realtime", "m", 0.02)  # not enabled: no flusher drains it
    assert not rec.drain()
    rec.enabled = True
    for v in (0.02, 0.02, 3.0):
        rec.observe(stats.TTFT, "realtime", "m", v)
    now[0] += 60
    rec.observe(stats.QUEUE, "batch", "", 0.001)
    minute = 1_000_020  # 1_000_030 rounded down to its minute
    assert rec.drain() == {
        (stats.TTFT, "realtime", "m", minute, 2): 2, (stats.TTFT, "realtime", "m", minute, 9): 1,
        (stats.QUEUE, "batch", "", minute + 60, 0): 1}
    assert not rec.drain()


def test_a_write_redis_refuses_drops_its_counts_without_raising() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = redis.Redis(port=port, socket_connect_timeout=0.5)
    rec = stats.Recorder()
    rec.enabled = True
    rec.observe(stats.QUEUE, "realtime", "m", 0.1)
    assert rec.write(r) == 0
    assert not rec.drain()  # dropped, not kept to grow without bound
