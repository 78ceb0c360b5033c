"""The latency history behind the dashboard: time to first token and queue time per
lane and model, kept in Redis as one histogram per minute for two hours.

Workers observe into a ``Recorder`` (a counter increment under a lock: no I/O on the
engine thread); its ``Flusher`` thread writes what was observed once a second as one
pipeline of HINCRBYs (a hash per series and minute, a field per bucket, expiring after
``RETENTION_S``). A Redis error drops that second's counts with a warning: the history
is best effort and never fails a request. ``history`` reads it back per minute (count,
p50, p99) and over the last 5 and 60 minutes, the quantiles estimated within buckets as
Prometheus' ``histogram_quantile`` does. The buckets are those of the workers'
``inferq_queue_seconds`` and ``inferq_time_to_first_token_seconds``.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import orjson
import redis

from jobs.core import redis_keys
from jobs.core.lanes import ALL_LANES

log = logging.getLogger("inferq.stats")

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FIELDS = tuple(repr(b) for b in BOUNDS) + ("+Inf",)  # a bucket's field: its upper bound
TTFT, QUEUE = "ttft", "queue"
STEP_S = 60
RETENTION_S = 2 * 3600
SUMMARY_WINDOWS = (300, 3600)
PREFIX = redis_keys.STATS
SERIES = PREFIX + "series"  # {json [metric, lane, model]: the last minute written}
LANE_ORDER = ALL_LANES

_INDEX = {f: i for i, f in enumerate(FIELDS)}
Key = tuple[str, str, str, int, int]  # metric, lane, model, minute, bucket


def bucket_of(seconds: float) -> int:
    """The bucket an observation falls in: the first whose upper bound is >= it."""
    return bisect.bisect_left(BOUNDS, max(0.0, seconds))


def minute_of(t: float) -> int:
    return int(t) // STEP_S * STEP_S


def quantile(q: float, counts: Sequence[int]) -> float | None:
    """The ``q``-quantile (0 < q <= 1) of a histogram given by its per-bucket counts
    (``len(FIELDS)`` of them, not cumulative), interpolated linearly within the bucket
    it falls in, as Prometheus' ``histogram_quantile``: the lowest bucket starts at 0,
    and a rank in the +Inf bucket is the highest finite bound. None when empty."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for i, c in enumerate(counts):
        if i == len(BOUNDS):
            return BOUNDS[-1]
        if below + c >= rank:
            start = 0.0 if i == 0 else BOUNDS[i - 1]
            return start + (BOUNDS[i] - start) * ((rank - below) / c if c else 1.0)
        below += c
    return BOUNDS[-1]


def _key(metric: str, lane: str, model: str, minute: int) -> str:
    return f"{PREFIX}{metric}:{lane}:{model}:{minute}"


class Recorder:
    """A process's observations not yet written. ``observe`` is called where a worker
    observes the matching Prometheus histogram; it records nothing until a ``Flusher``
    drains it (a process that never writes history keeps no buffer)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.enabled = False
        self._lock = threading.Lock()
        self._counts: Counter[Key] = Counter()

    def observe(self, metric: str, lane: str, model: str, seconds: float) -> None:
        if not self.enabled:
            return
        key = (metric, lane, model, minute_of(self.clock()), bucket_of(seconds))
        with self._lock:
            self._counts[key] += 1

    def drain(self) -> Counter[Key]:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts

    def write(self, r: redis.Redis) -> int:
        """Write what was observed since the last write (one pipeline); the number of
        observations written, 0 when Redis refused them (they are dropped)."""
        counts = self.drain()
        if not counts:
            return 0
        try:
            _write(r, counts)
        except redis.RedisError as e:
            log.warning("latency history: %d observations dropped (%s)", sum(counts.values()), e)
            return 0
        return sum(counts.values())


def _write(r: redis.Redis, counts: Counter[Key]) -> None:
    last: dict[str, int] = {}
    with r.pipeline(transaction=False) as p:
        for (metric, lane, model, minute, bucket), n in counts.items():
            key = _key(metric, lane, model, minute)
            p.hincrby(key, FIELDS[bucket], n)
            p.expire(key, RETENTION_S + STEP_S)
            name = orjson.dumps([metric, lane, model]).decode()
            last[name] = max(last.get(name, 0), minute)
        p.hset(SERIES, mapping=last)  # type: ignore[arg-type]
        p.expire(SERIES, RETENTION_S + STEP_S)
        p.execute()


class Flusher(threading.Thread):
    """Writes a ``Recorder`` to Redis every ``every_s`` until stopped, then once more.
    One per worker process (a lane thread of its runtime)."""

    def __init__(self, recorder: Recorder, r: redis.Redis, every_s: float = 1.0) -> None:
        super().__init__(name="inferq-stats", daemon=True)
        self.recorder, self.r, self.every_s = recorder, r, every_s
        self.stopping = threading.Event()
        recorder.enabled = True

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            self.recorder.write(self.r)
        self.recorder.write(self.r)

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=5)
        self.recorder.enabled = False


# Reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One minute of a series (``t``: the minute's start, unix seconds)."""

    t: int
    count: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True)
class Summary:
    """A series over the last ``window_s`` seconds (the current minute included)."""

    window_s: int
    count: int
    rate_per_s: float
    p50: float | None
    p99: float | None


@dataclass(frozen=True)
class Series:
    """One metric of one lane, every model together."""

    lane: str
    metric: str
    points: list[Point]
    summaries: list[Summary]


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def _point(t: int, counts: Sequence[int]) -> Point:
    return Point(t, sum(counts), _round(quantile(0.5, counts)), _round(quantile(0.99, counts)))


def _sum(rows: Iterable[Sequence[int]]) -> list[int]:
    out = [0] * len(FIELDS)
    for row in rows:
        for i, c in enumerate(row):
            out[i] += c
    return out


def _counts(raw: dict[bytes, bytes]) -> list[int]:
    out = [0] * len(FIELDS)
    for f, v in raw.items():
        i = _INDEX.get(f.decode() if isinstance(f, bytes) else str(f))
        if i is not None:
            out[i] += int(v)
    return out


def _series_names(r: redis.Redis, oldest: int) -> list[tuple[str, str, str]]:
    names = []
    for raw, minute in r.hgetall(SERIES).items():
        metric, lane, model = orjson.loads(raw)
        if int(minute) >= oldest:
            names.append((str(metric), str(lane), str(model)))
    return sorted(names)


def history(r: redis.Redis, window_s: int, now: float | None = None) -> list[Series]:
    """Every lane and metric observed within the last ``window_s`` seconds (at most the
    retention) or the ``SUMMARY_WINDOWS``: its minutes that had observations, and its
    summaries. Ordered by lane, then ttft before queue."""
    now = time.time() if now is None else now
    last = minute_of(now)
    span = min(max(window_s, *SUMMARY_WINDOWS), RETENTION_S)
    minutes = [last - i * STEP_S for i in range(-(-span // STEP_S))][::-1]
    names = _series_names(r, minutes[0])
    with r.pipeline(transaction=False) as p:
        for metric, lane, model in names:
            for m in minutes:
                p.hgetall(_key(metric, lane, model, m))
        raws = p.execute()
    by_series: dict[tuple[str, str], dict[int, list[int]]] = {}
    for n, (metric, lane, _model) in enumerate(names):
        per_minute = by_series.setdefault((lane, metric), {})
        for j, m in enumerate(minutes):
            counts = _counts(raws[n * len(minutes) + j])
            per_minute[m] = _sum([per_minute.get(m, [0] * len(FIELDS)), counts])
    out = []
    for (lane, metric), per_minute in by_series.items():
        series = _series(lane, metric, per_minute, last, now, window_s)
        if series.points or any(s.count for s in series.summaries):
            out.append(series)
    return sorted(out, key=lambda s: (_lane_rank(s.lane), s.lane, s.metric != TTFT))


def _series(lane: str, metric: str, per_minute: dict[int, list[int]], last: int, now: float,
            window_s: int) -> Series:
    def within(seconds: int) -> list[int]:
        first = last - (-(-seconds // STEP_S) - 1) * STEP_S
        return [m for m in sorted(per_minute) if m >= first]

    points = [_point(m, per_minute[m]) for m in within(min(window_s, RETENTION_S))
              if sum(per_minute[m])]
    summaries = []
    for w in SUMMARY_WINDOWS:
        ms = within(w)
        counts = _sum(per_minute[m] for m in ms)
        elapsed = max(now - ms[0], 1.0) if ms else float(w)
        summaries.append(Summary(w, sum(counts), round(sum(counts) / elapsed, 3),
                                 _round(quantile(0.5, counts)), _round(quantile(0.99, counts))))
    return Series(lane, metric, points, summaries)


def _lane_rank(lane: str) -> int:
    return LANE_ORDER.index(lane) if lane in LANE_ORDER else len(LANE_ORDER)
