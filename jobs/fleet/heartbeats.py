"""Workers' heartbeats: what each live worker process serves and holds, announced in Redis
every few seconds and expiring after missed beats. Placement, fair share, admission,
the dashboard and the janitor read them here."""

from __future__ import annotations

from typing import Any, TypedDict

import orjson
import redis

from jobs.core import redis_keys
from jobs.core.status import BreakerState


class Heartbeat(TypedDict, total=False):
    """One worker process's announcement (a control process sends the first four)."""

    name: str  # the worker's name: host:pid
    lanes: list[str]
    models: list[str]  # the names it holds
    metrics_url: str | None
    resident: list[str]  # the versions it holds (name@version)
    breaker: str  # BreakerState
    residency: dict[str, Any]  # its memory budget and what fills it
    engines: dict[str, str]  # name@version -> the generation engine running it
    stats: dict[str, Any]  # its engines' counters
    service: dict[str, Any]  # service times per lane and model (admission's μ)
    accelerator: str
    simulated_profile: str
    at: float  # when it was sent (epoch seconds)


def write(r: redis.Redis, name: str, beat: Heartbeat, ttl_s: float) -> None:
    r.set(redis_keys.worker(name), orjson.dumps(beat), px=int(ttl_s * 1000))


def current(r: redis.Redis) -> list[Heartbeat]:
    """Every current heartbeat, control workers' and open breakers' included (a worker
    that missed three beats has none)."""
    found = list(r.scan_iter(match=redis_keys.WORKERS + "*", count=100))
    return [orjson.loads(raw) for raw in (r.mget(found) if found else []) if raw]


def of(r: redis.Redis, names: list[str]) -> dict[str, Heartbeat]:
    """The current heartbeats of the workers named (those that have one)."""
    got = r.mget([redis_keys.worker(n) for n in names]) if names else []
    return {n: orjson.loads(raw) for n, raw in zip(names, got, strict=True) if raw}


def holds(beat: Heartbeat, model: str) -> bool:
    """Whether a heartbeat's worker holds ``model``: a version (``name@version``, among
    its ``resident`` ones) or a name (among its ``models``)."""
    if "@" in model:
        return model in beat.get("resident", ())
    return model in beat.get("models", ())


def live_workers(r: redis.Redis, lane: str, model: str | None = None) -> list[Heartbeat]:
    """Workers whose heartbeat is current and that serve ``lane`` (and hold ``model``,
    a name or a version, if given)."""
    return [b for b in current(r)
            if lane in b.get("lanes", []) and b.get("breaker") != BreakerState.OPEN
            and (model is None or holds(b, model))]
