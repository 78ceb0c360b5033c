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

from jobs.core.context import Context
from jobs.core.lanes import REALTIME
from jobs.core.status import StreamEvent
from jobs.fleet import placement
from jobs.fleet.shadow import record
from jobs.realtime.client import RealtimeClient, TokenStream

log = logging.getLogger("inferq.shadow")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(4, thread_name_prefix="inferq-shadow")
        return _pool


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
    return lambda ref: placement.ensure(ctx, ref, REALTIME)


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
