"""Shadow traffic: realtime requests mirrored to a candidate version, answered, compared
with the answer the client got, and never returned.

A mirrored request is sent after the client's answer, off the request's thread, with
no project to bill (``RealtimeClient`` without a payer): it costs the candidate's
worker time only. The comparison is recorded per version in Redis: for embeddings
the mean cosine similarity of each vector to the default version's; for chat and
completions whether the generated text is exactly the same (greedy decoding makes
that the measure; sampled requests are compared as sent). Latency is recorded for
both sides, the client's answer under the version that served it.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
import redis

from jobs.core.context import Context
from jobs.core.status import StreamEvent
from jobs.fleet import placement, registry
from jobs.realtime.client import RealtimeClient, TokenStream

log = logging.getLogger("inferq.shadow")

STATS = "inferq:shadow:"  # + name: hash "<version>|<field>" -> number
LATENCIES = "inferq:shadow-latency:"  # + name@version: recent latencies (s), newest first
KEEP_LATENCIES = 2000
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(4, thread_name_prefix="inferq-shadow")
        return _pool


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
            lat = LATENCIES + registry.ref(name, version)
            p.lpush(lat, f"{seconds:.6f}")
            p.ltrim(lat, 0, KEEP_LATENCIES - 1)
        p.execute()


def report(r: redis.Redis, name: str) -> list[dict[str, Any]]:
    """Per version of ``name`` seen in shadow runs: requests answered as the client's
    (primary) and as a shadow, agreement with the client's answers (mean cosine or
    exact-match share), errors, and latency p50/p99 of recent answers."""
    raw = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
                                                         else v)
           for k, v in r.hgetall(STATS + name).items()}
    versions = sorted({k.split("|", 1)[0] for k in raw}, key=registry.version_key)
    out = []
    for v in versions:
        lats = sorted(float(x) for x in r.lrange(LATENCIES + registry.ref(name, v), 0, -1))
        compared = int(raw.get(f"{v}|compared", 0))
        out.append({
            "version": v, "primary": int(raw.get(f"{v}|primary", 0)),
            "shadow": int(raw.get(f"{v}|shadow", 0)), "errors": int(raw.get(f"{v}|errors", 0)),
            "compared": compared,
            "agreement": (float(raw[f"{v}|agreement_sum"]) / compared) if compared else None,
            "latency_p50_s": _quantile(lats, 0.5), "latency_p99_s": _quantile(lats, 0.99)})
    return out


def reset(r: redis.Redis, name: str) -> None:
    keys = [STATS + name, *r.scan_iter(match=LATENCIES + name + "@*", count=100)]
    r.delete(*keys)


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# Comparisons ---------------------------------------------------------------------------------


def vectors(body: dict[str, Any]) -> list[np.ndarray]:
    """The embeddings of a response body, float or base64 (float32 little-endian)."""
    out = []
    for d in sorted(body["data"], key=lambda d: d["index"]):
        e = d["embedding"]
        out.append(np.frombuffer(base64.b64decode(e), dtype="<f4") if isinstance(e, str)
                   else np.asarray(e, dtype=np.float32))
    return out


def cosine(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Mean cosine similarity of paired vectors (0 when the answers do not pair up)."""
    if len(a) != len(b) or not a:
        return 0.0
    sims = []
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return 0.0
        n = float(np.linalg.norm(x) * np.linalg.norm(y))
        sims.append(float(np.dot(x, y)) / n if n else 0.0)
    return float(np.mean(sims))


# Mirroring ----------------------------------------------------------------------------------


def mirror_embeddings(ctx: Context, body: dict[str, Any], primary: bytes,
                      versions: tuple[str, ...]) -> None:
    """Mirror an embeddings request, whose answer to the client was ``primary``."""
    if versions:
        _executor().submit(_embeddings, ctx, dict(body), primary, versions)


def mirror_generation(ctx: Context, kind: str, body: dict[str, Any], text: str,
                      versions: tuple[str, ...]) -> None:
    """Mirror a chat or completion request, whose generated text was ``text``."""
    if versions:
        _executor().submit(_generation, ctx, kind, dict(body), text, versions)


def _place(ctx: Context) -> Any:
    return lambda ref: placement.ensure(ctx, ref, "realtime")


def _embeddings(ctx: Context, body: dict[str, Any], primary: bytes,
                versions: tuple[str, ...]) -> None:
    name = body["model"]
    try:
        want = vectors(orjson.loads(primary))
    except Exception:  # noqa: BLE001 - nothing to compare with
        log.warning("shadow of %s: the client's answer could not be read", name)
        return
    body = {**body, "encoding_format": "float"}
    for v in versions:
        t0 = time.perf_counter()
        try:
            got = RealtimeClient(ctx.redis, version=v, place=_place(ctx)).call(
                "embeddings", body, ctx.settings.realtime_timeout_s)
            record(ctx.redis, name, v, "shadow", time.perf_counter() - t0,
                   cosine(want, vectors(orjson.loads(got))))
        except Exception as e:  # noqa: BLE001 - a shadow's failure is only counted
            log.info("shadow %s@%s failed: %s", name, v, e)
            record(ctx.redis, name, v, "shadow", time.perf_counter() - t0, error=True)


def _generation(ctx: Context, kind: str, body: dict[str, Any], text: str,
                versions: tuple[str, ...]) -> None:
    name, st = body["model"], ctx.settings
    for v in versions:
        t0 = time.perf_counter()
        stream = TokenStream(ctx.redis, kind, body, first_event_s=st.first_token_timeout_s,
                             idle_s=st.no_progress_timeout_s, version=v, place=_place(ctx))
        try:
            stream.open()
            parts = []
            for ev in stream.events():
                if ev is not None and ev["t"] == StreamEvent.DELTA:
                    parts.append(ev["text"])
                elif ev is not None and ev["t"] == StreamEvent.ERROR:
                    raise RuntimeError(ev["error"]["message"])
            record(ctx.redis, name, v, "shadow", time.perf_counter() - t0,
                   1.0 if "".join(parts) == text else 0.0)
        except Exception as e:  # noqa: BLE001 - a shadow's failure is only counted
            log.info("shadow %s@%s failed: %s", name, v, e)
            record(ctx.redis, name, v, "shadow", time.perf_counter() - t0, error=True)
        finally:
            stream.close()
