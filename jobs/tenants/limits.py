"""Rate limits per project and model, decided atomically in Redis for every API process.

Each request is one decision: one Lua script (one round trip) checks every limit that
applies to it — requests per minute, tokens per minute, requests per day and, for a
stream, the project's concurrent streams — and takes all of them or none. Redis runs
a script alone, so two API processes can never both see the last free slot: there
is no read-then-write race.

How a window counts (a sliding-window log in Redis) is in ``jobs.tenants.rate_windows``,
what a request reserves in ``jobs.tenants.token_counts``, and a project's batch input
tokens per day in ``jobs.tenants.batch_quota``.

Tokens are reserved at admission as an estimate (``request_tokens``) and corrected
when the real counts are known (``settle``: the worker's ``usage``), refunding or
charging the difference in the window the reservation is in.

A realtime generation may reserve at most ``realtime_request_tokens`` of the engine's
work: its sequences (``n``, or ``best_of``) times its ``max_tokens`` (by default what
its prompt leaves of the context); beyond that it is a 400 naming the parameter
(``reservation_refused``), checked by the API where the body says both and by the
worker once the prompt's length is known.

Limits come from the ``rate_limits`` rows (per project and model); a missing row or a
NULL column means the deployment's default from settings, where 0 means unlimited.
Rows are cached per process for at most ``CACHE_TTL_S``, so a change made through the
Admin API applies within that time in every API process.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from jobs.core.access_tables import RateLimit
from jobs.core.context import Context
from jobs.core.errors import InferqError, InvalidRequest, Unavailable
from jobs.core.schema import new_id
from jobs.tenants.rate_windows import (
    DAY_BUCKET_MS,
    DAY_MS,
    DECIDE,
    MINUTE_MS,
    RENEW,
    SETTLE,
    client,
    script,
    streams_key,
    window_keys,
)

log = logging.getLogger("inferq.limits")

CACHE_TTL_S = 1.0


class RateLimited(InferqError, status=429, code="rate_limit_exceeded"):
    """A limit of the project would be exceeded; ``type`` names which kind
    (``requests``, ``tokens``), as OpenAI does."""

    def __init__(self, message: str, kind: str, headers: dict[str, str]) -> None:
        super().__init__(message, headers=headers)
        self.type = kind


@dataclass(frozen=True)
class Limits:
    """A project's effective limits for one model; 0 is unlimited."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    requests_per_day: int = 0
    batch_day_input_tokens: int = 0
    concurrent_streams: int = 0
    realtime_request_tokens: int = 0  # n x max_tokens of one realtime generation


def defaults(ctx: Context) -> Limits:
    st = ctx.settings
    return Limits(st.default_max_requests_per_1_minute, st.default_max_tokens_per_1_minute,
                  st.default_max_requests_per_1_day, st.default_batch_1_day_max_input_tokens,
                  st.default_max_concurrent_streams,
                  st.default_max_tokens_per_realtime_request)


def from_row(row: RateLimit | None, default: Limits) -> Limits:
    """A row's limits over ``default``: a NULL column (or no row) takes the default."""
    if row is None:
        return default

    def pick(value: int | None, fallback: int) -> int:
        return fallback if value is None else max(0, int(value))

    return Limits(pick(row.max_requests_per_1_minute, default.requests_per_minute),
                  pick(row.max_tokens_per_1_minute, default.tokens_per_minute),
                  pick(row.max_requests_per_1_day, default.requests_per_day),
                  pick(row.batch_1_day_max_input_tokens, default.batch_day_input_tokens),
                  pick(row.max_concurrent_streams, default.concurrent_streams),
                  pick(row.max_tokens_per_realtime_request, default.realtime_request_tokens))


def reservation_refused(cap: int, sequences: int, max_tokens: int,
                        param: str = "n") -> InvalidRequest | None:
    """The 400 of a realtime generation of ``sequences`` sequences of up to ``max_tokens``
    tokens each when that reserves more than ``cap`` tokens (0: no cap), else None. It
    names ``max_tokens`` when that alone is over the cap, else ``param`` (``n``, or
    ``best_of`` when that is what asks for the sequences)."""
    reserved = sequences * max_tokens
    if cap <= 0 or reserved <= cap:
        return None
    name = "max_tokens" if max_tokens > cap else param
    return InvalidRequest(
        f"{name}: this request reserves {sequences} x {max_tokens} = {reserved} tokens "
        f"({param} x max_tokens, max_tokens by default what the prompt leaves of the "
        f"context); a realtime request of this project may reserve at most {cap} tokens. "
        f"Lower {name}", param=name, code="request_too_large")


_lock = threading.Lock()
# (database url, tenant, model) -> (when read, limits)
_cache: dict[tuple[str, str, str], tuple[float, Limits]] = {}


def limits_for(ctx: Context, tenant_id: str, model: str, ttl_s: float = CACHE_TTL_S) -> Limits:
    """The project's effective limits for ``model``, read at most once per ``ttl_s``."""
    key = (ctx.settings.database_url, tenant_id, model)
    with _lock:
        hit = _cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < ttl_s:
        return hit[1]
    with ctx.db.session() as s:
        row = s.get(RateLimit, (tenant_id, model))
        fresh = from_row(row, defaults(ctx))
    with _lock:
        _cache[key] = (time.monotonic(), fresh)
    return fresh


# Headers ----------------------------------------------------------------------------------


def duration(ms: int) -> str:
    """A reset time as OpenAI writes it (Go's duration format): ``20ms``, ``1s``,
    ``1.5s``, ``6m0s``, ``1h2m3s``."""
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


@dataclass
class Window:
    """One limit window of a decision: its limit, what remains and when it is empty."""

    kind: str  # requests | tokens | requests_day
    limit: int
    remaining: int
    reset_ms: int


def headers_for(windows: list[Window]) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for the per-minute windows."""
    out: dict[str, str] = {}
    for w in windows:
        if w.kind in ("requests", "tokens"):
            out[f"x-ratelimit-limit-{w.kind}"] = str(w.limit)
            out[f"x-ratelimit-remaining-{w.kind}"] = str(max(0, w.remaining))
            out[f"x-ratelimit-reset-{w.kind}"] = duration(w.reset_ms)
    return out


# The decision -----------------------------------------------------------------------------


@dataclass
class Grant:
    """An admitted request: what it holds, to settle or release when it ends."""

    tenant_id: str
    model: str
    member: str
    tokens: int = 0  # reserved in the tokens window (0: no tokens window tracked)
    stream: bool = False  # holds a stream lease
    headers: dict[str, str] = field(default_factory=dict)
    lease_ms: int = 0
    renewed: float = 0.0


_warned = 0.0


def _warn_open(e: Exception) -> None:
    global _warned
    if time.monotonic() - _warned > 10:
        _warned = time.monotonic()
        log.warning("rate limits not enforced, their Redis is unavailable: %s", e)


def charge(ctx: Context, tenant_id: str, model: str, tokens: int, *, stream: bool = False,
          member: str | None = None) -> Grant:
    """Decide one request (``tokens``: its reservation) against every limit of the
    project for ``model``, in one script. Refused: RateLimited (429) whose headers
    carry ``retry-after`` and the ``x-ratelimit-*`` values. Redis unreachable: the
    per-minute and per-day limits fail open (the request goes on, unlimited), the
    concurrent-stream cap fails closed (503)."""
    lim = limits_for(ctx, tenant_id, model)
    member = member or new_id("rl_")
    # Unlimited per-minute kinds are still counted (against a number no one reaches),
    # so every response can say what was used.
    unlimited = ctx.settings.rate_limit_unlimited
    specs = [(kind, limit, cost, width, g) for kind, limit, cost, width, g in (
        ("requests", lim.requests_per_minute or unlimited, 1, MINUTE_MS, 0),
        ("tokens", lim.tokens_per_minute or unlimited, tokens, MINUTE_MS, 0),
        ("requests_day", lim.requests_per_day, 1, DAY_MS, DAY_BUCKET_MS)) if limit > 0]
    cap = lim.concurrent_streams if stream and lim.concurrent_streams > 0 else -1
    keys: list[str] = []
    args: list[Any] = [len(specs), member, cap, int(ctx.settings.stream_lease_s * 1000)]
    for kind, limit, cost, width, g in specs:
        keys += window_keys(tenant_id, model, kind)
        args += [limit, cost, width, g]
    if cap >= 0:
        keys.append(streams_key(tenant_id, model))
    r = client(ctx)
    try:
        raw = script(r, DECIDE)(keys=keys, args=args, client=r)
    except redis.RedisError as e:
        if cap >= 0:
            raise Unavailable("the concurrent-stream limit cannot be checked right now "
                              "(its Redis is unavailable)", retry_after=5) from e
        _warn_open(e)
        return Grant(tenant_id, model, member)
    admitted, refused, retry = int(raw[0]), int(raw[1]), int(raw[2])
    windows = [Window(spec[0], spec[1], spec[1] - int(raw[3 + 2 * i]), int(raw[4 + 2 * i]))
               for i, spec in enumerate(specs)]
    headers = headers_for(windows)
    if not admitted:
        raise _refusal(model, specs, windows, refused, retry, tokens, cap, headers)
    tracked = any(spec[0] == "tokens" for spec in specs)
    return Grant(tenant_id, model, member, tokens if tracked else 0, cap >= 0, headers,
                 int(ctx.settings.stream_lease_s * 1000), time.monotonic())


def _refusal(model: str, specs: list[tuple[str, int, int, int, int]], windows: list[Window],
             refused: int, retry_ms: int, tokens: int, cap: int,
             headers: dict[str, str]) -> RateLimited:
    if refused > len(specs):
        return RateLimited(f"Too many concurrent streams for {model}: limit {cap}. Wait for a "
                           "stream to end", "requests", {**headers, "retry-after": "1",
                                                         "retry-after-ms": "1000"})
    w = windows[refused - 1]
    if retry_ms < 0:
        return RateLimited(f"Request too large for {model}: limit {w.limit} tokens per min, "
                           f"requested {tokens}. Send fewer tokens", "tokens", headers)
    per = "day" if w.kind == "requests_day" else "min"
    kind = "tokens" if w.kind == "tokens" else "requests"
    used = w.limit - w.remaining
    wanted = f", requested {tokens}" if kind == "tokens" else ""
    return RateLimited(f"Rate limit reached for {model} on {kind} per {per}: limit {w.limit}, "
                       f"used {used}{wanted}. Please try again in {duration(retry_ms)}", kind,
                       {**headers, "retry-after": str(max(1, math.ceil(retry_ms / 1000))),
                        "retry-after-ms": str(max(1, retry_ms))})


def settle_member(ctx: Context, tenant_id: str, model: str, member: str, real: int) -> int:
    """Correct a reservation in its tokens window to ``real`` tokens (a refund or a
    charge); a no-op once the reservation has left the window. Returns the change."""
    r = client(ctx)
    _, w, tot = window_keys(tenant_id, model, "tokens")
    try:
        return int(script(r, SETTLE)(keys=[w, tot], args=[member, max(0, real)], client=r))
    except redis.RedisError as e:
        _warn_open(e)
        return 0


def settle(ctx: Context, grant: Grant, real: int) -> int:
    """Correct ``grant``'s reservation to the ``real`` tokens the worker reported."""
    if not grant.tokens or real == grant.tokens:
        return 0
    delta = settle_member(ctx, grant.tenant_id, grant.model, grant.member, real)
    grant.tokens = max(0, real)
    return delta


def renew_stream(ctx: Context, grant: Grant) -> None:
    """Extend the stream lease if a third of it has passed (call it on every event)."""
    if not grant.stream or time.monotonic() - grant.renewed < grant.lease_ms / 3000:
        return
    r = client(ctx)
    try:
        script(r, RENEW)(keys=[streams_key(grant.tenant_id, grant.model)],
                          args=[grant.member, grant.lease_ms], client=r)
        grant.renewed = time.monotonic()
    except redis.RedisError as e:
        _warn_open(e)


def release_stream(ctx: Context, grant: Grant) -> None:
    """Give the stream slot back (the lease lapses by itself if this process dies)."""
    if not grant.stream:
        return
    grant.stream = False
    try:
        client(ctx).zrem(streams_key(grant.tenant_id, grant.model), grant.member)
    except redis.RedisError as e:
        _warn_open(e)
