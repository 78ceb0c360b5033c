"""Shadow traffic's record: per version of a name, the answers it gave as the client's
(primary) or as a shadow, their agreement with the client's answers and their latency,
kept in Redis. The mirroring itself is the realtime lane's (``jobs.realtime.shadow``).
"""


from __future__ import annotations

import logging

import redis

from jobs.core import redis_keys, refs
from jobs.fleet import registry
from jobs.protocol.objects.fleet import ShadowRow

log = logging.getLogger("inferq.shadow")

STATS, LATENCIES = redis_keys.SHADOW_STATS, redis_keys.SHADOW_LATENCIES
KEEP_LATENCIES = 2000
def record(r: redis.Redis, name: str, version: str, role: str, seconds: float,
           agreement: float | None = None, error: bool = False) -> None:
    """One answer of ``name@version``, as the client's (``primary``) or a shadow's."""
    key = STATS + name
    with r.pipeline() as p:
        p.hincrby(key, f"{version}|{role}", 1)
        p.hset(key, f"{version}|role", role)
        if error:
            p.hincrby(key, f"{version}|errors", 1)
        if agreement is not None:
            p.hincrbyfloat(key, f"{version}|agreement_sum", agreement)
            p.hincrby(key, f"{version}|compared", 1)
        if not error:
            lat = LATENCIES + refs.model_ref(name, version)
            p.lpush(lat, f"{seconds:.6f}")
            p.ltrim(lat, 0, KEEP_LATENCIES - 1)
        p.execute()


def report(r: redis.Redis, name: str) -> list[ShadowRow]:
    """Per version of ``name`` seen in shadow runs: requests answered as the client's
    (primary) and as a shadow, agreement with the client's answers (mean cosine or
    exact-match share), errors, and latency p50/p99 of recent answers."""
    raw = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
                                                         else v)
           for k, v in r.hgetall(STATS + name).items()}
    versions = sorted({k.split("|", 1)[0] for k in raw}, key=registry.version_key)
    out = []
    for v in versions:
        lats = sorted(float(x) for x in r.lrange(LATENCIES + refs.model_ref(name, v), 0, -1))
        compared = int(raw.get(f"{v}|compared", 0))
        out.append(ShadowRow(
            version=v, primary=int(raw.get(f"{v}|primary", 0)),
            shadow=int(raw.get(f"{v}|shadow", 0)), errors=int(raw.get(f"{v}|errors", 0)),
            compared=compared,
            agreement=(float(raw[f"{v}|agreement_sum"]) / compared) if compared else None,
            latency_p50_s=_quantile(lats, 0.5), latency_p99_s=_quantile(lats, 0.99)))
    return out


def reset(r: redis.Redis, name: str) -> None:
    keys = [STATS + name, *r.scan_iter(match=LATENCIES + name + "@*", count=100)]
    r.delete(*keys)


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]
