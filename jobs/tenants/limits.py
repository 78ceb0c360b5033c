"""Rate limits per project and model, decided atomically in Redis for every API process.

Each request is one decision: one Lua script (one round trip) checks every limit that
applies to it — requests per minute, tokens per minute, requests per day and, for a
stream, the project's concurrent streams — and takes all of them or none. Redis runs
a script alone, so two API processes can never both see the last free slot: there
is no read-then-write race.

The algorithm is a **sliding-window log**: a window holds its admitted requests as
entries (score: when, weight: requests or tokens) and a running total. An entry
counts until it is a full window old; a request is admitted when the total plus its
cost stays within the limit. So *at most L requests (or tokens) are admitted in any
window of one minute*, wherever the window starts, and when L slots are free exactly
L of any number of concurrent callers are admitted. A token bucket or GCRA keeps one
number per key but refills continuously: right after a burst of L it already admits
more, so a minute can see nearly 2 L. The per-minute windows log one entry per
request; the day window logs one entry per minute (a bucket counted, conservatively,
until its last possible request is a day old), which bounds its memory to 1,441
entries. Time is the Redis server's (``TIME``), one clock for all API processes.

Tokens are reserved at admission as an estimate (``request_tokens``) and corrected
when the real counts are known (``settle``: the worker's ``usage``), refunding or
charging the difference in the window the reservation is in.

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.errors import InferqError, Unavailable
from jobs.core.schema import Batch, RateLimit, Tenant, new_id
from jobs.protocol.requests import CHAT, EMBEDDINGS, as_chat

log = logging.getLogger("inferq.limits")

CACHE_TTL_S = 1.0
MINUTE_MS = 60_000
DAY_MS = 86_400_000
DAY_BUCKET_MS = 60_000
# Token estimates (the API holds no tokenizer). Every token of a byte-level BPE or a
# WordPiece vocabulary covers at least one byte of its text, so a text's UTF-8 length
# bounds its token count; what the model adds is bounded separately.
EMBEDDING_SPECIAL_TOKENS = 2  # [CLS] and [SEP] around each input
MESSAGE_OVERHEAD_TOKENS = 8  # a chat template's role markers around one message
PROMPT_OVERHEAD_TOKENS = 64  # its own text: a default system prompt, the generation prompt


class RateLimited(InferqError):
    """429: a limit of the project would be exceeded; ``type`` names which kind
    (``requests``, ``tokens``), as OpenAI does."""

    status = 429
    code = "rate_limit_exceeded"

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


def defaults(ctx: Context) -> Limits:
    st = ctx.settings
    return Limits(st.default_max_requests_per_1_minute, st.default_max_tokens_per_1_minute,
                  st.default_max_requests_per_1_day, st.default_batch_1_day_max_input_tokens,
                  st.default_max_concurrent_streams)


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
                  pick(row.max_concurrent_streams, default.concurrent_streams))


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


# Token estimates --------------------------------------------------------------------------


def _text_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_bytes(v) for v in value.values())
    return 0


def embedding_tokens(inputs: Iterable[str | list[int]]) -> int:
    """Exact for token-id inputs (their ids plus the model's special tokens); an upper
    bound for texts (their UTF-8 bytes plus the special tokens)."""
    total = 0
    for x in inputs:
        total += (len(x) if isinstance(x, list) else len(x.encode())) + EMBEDDING_SPECIAL_TOKENS
    return total


def prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """An upper bound of the prompt tokens of a validated request body."""
    endpoint, body = as_chat(endpoint, body)  # a Responses body: its chat request's
    if endpoint == EMBEDDINGS:
        v = body.get("input")
        if isinstance(v, str):
            return embedding_tokens([v])
        if isinstance(v, list) and v and isinstance(v[0], int):
            return embedding_tokens([v])
        return embedding_tokens(v if isinstance(v, list) else [])
    if endpoint == CHAT:
        messages = body.get("messages") or []
        return PROMPT_OVERHEAD_TOKENS + sum(
            MESSAGE_OVERHEAD_TOKENS + _text_bytes(m.get("content")) + _text_bytes(m.get("name"))
            for m in messages if isinstance(m, dict))
    return PROMPT_OVERHEAD_TOKENS + _text_bytes(body.get("prompt"))


def request_tokens(endpoint: str, body: dict[str, Any], default_max_tokens: int) -> int:
    """What a request reserves in its tokens-per-minute window: its prompt's upper
    bound plus, for generation, ``max_completion_tokens``/``max_tokens`` (or
    ``default_max_tokens`` when it names none)."""
    endpoint, body = as_chat(endpoint, body)  # a Responses body: its chat request's
    tokens = prompt_tokens(endpoint, body)
    if endpoint != EMBEDDINGS:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        tokens += int(limit) if limit else default_max_tokens
    return tokens


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

# KEYS: per window its sorted set (member -> when), weights (member -> cost), total;
#       then, if a stream lease is asked for, the project's stream leases (member -> expiry).
# ARGV: windows, member, stream cap (-1: none asked), stream lease ms,
#       then per window: limit, cost, width ms, bucket ms (0: one entry per request).
# Returns: {admitted (1/0), refused window (0: none; windows + 1: streams), retry ms
#           (-1: never), then per window: used after the decision, reset ms}.
DECIDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local member = ARGV[2]
local cap = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local used, refused, retry = {}, 0, 0
for i = 1, n do
  local z, w, tot = KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i]
  local b = 4 + (i-1)*4
  local limit, cost = tonumber(ARGV[b+1]), tonumber(ARGV[b+2])
  local width, g = tonumber(ARGV[b+3]), tonumber(ARGV[b+4])
  local cutoff = now - width - g
  while true do
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', cutoff, 'LIMIT', 0, 500)
    if #old == 0 then break end
    local ws = redis.call('HMGET', w, unpack(old))
    local freed = 0
    for j = 1, #ws do freed = freed + (tonumber(ws[j]) or 0) end
    redis.call('HDEL', w, unpack(old))
    redis.call('ZREM', z, unpack(old))
    redis.call('DECRBY', tot, freed)
  end
  local u = tonumber(redis.call('GET', tot) or '0')
  used[i] = u
  if refused == 0 and u + cost > limit then
    refused = i
    if cost > limit then
      retry = -1
    else
      local need, acc, start = u + cost - limit, 0, 0
      retry = width
      while true do
        local page = redis.call('ZRANGE', z, start, start + 499, 'WITHSCORES')
        if #page == 0 then break end
        local names = {}
        for j = 1, #page, 2 do names[#names + 1] = page[j] end
        local ws = redis.call('HMGET', w, unpack(names))
        local found = false
        for j = 1, #names do
          acc = acc + (tonumber(ws[j]) or 0)
          if acc >= need then
            retry = tonumber(page[2*j]) + g + width - now
            found = true
            break
          end
        end
        if found then break end
        start = start + 500
      end
    end
  end
end
if refused == 0 and cap >= 0 then
  local s = KEYS[3*n+1]
  redis.call('ZREMRANGEBYSCORE', s, '-inf', now)
  if redis.call('ZCARD', s) >= cap then
    refused = n + 1
    retry = 1000
  end
end
local out = {refused == 0 and 1 or 0, refused, retry}
for i = 1, n do
  local z, w, tot = KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i]
  local b = 4 + (i-1)*4
  local cost, width, g = tonumber(ARGV[b+2]), tonumber(ARGV[b+3]), tonumber(ARGV[b+4])
  if refused == 0 and cost > 0 then
    local at, name = now, member
    if g > 0 then
      at = math.floor(now / g) * g
      name = tostring(at)
    end
    redis.call('ZADD', z, at, name)
    redis.call('HINCRBY', w, name, cost)
    redis.call('INCRBY', tot, cost)
    for _, k in ipairs({z, w, tot}) do redis.call('PEXPIRE', k, width + g + 1000) end
    used[i] = used[i] + cost
  end
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  local reset = 0
  if #last > 0 then reset = tonumber(last[2]) + g + width - now end
  out[#out + 1] = used[i]
  out[#out + 1] = reset
end
if refused == 0 and cap >= 0 then
  local s = KEYS[3*n+1]
  redis.call('ZADD', s, now + lease, member)
  redis.call('PEXPIRE', s, lease + 1000)
end
return out
"""

# KEYS: a window's weights, total. ARGV: member, real cost. Returns the change made.
SETTLE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
local delta = tonumber(ARGV[2]) - tonumber(cur)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('INCRBY', KEYS[2], delta)
return delta
"""

# KEYS: the project's stream leases. ARGV: member, lease ms. Extends a held lease.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
"""


def _prefix(tenant_id: str, model: str) -> str:
    return redis_keys.rate_limit(tenant_id, model)


def window_keys(tenant_id: str, model: str, kind: str) -> list[str]:
    p = f"{_prefix(tenant_id, model)}:{kind}"
    return [f"{p}:z", f"{p}:w", f"{p}:t"]


def streams_key(tenant_id: str, model: str) -> str:
    return f"{_prefix(tenant_id, model)}:streams"


_clients_lock = threading.Lock()
_clients: dict[str, redis.Redis] = {}


def client(ctx: Context) -> redis.Redis:
    """The Redis the limits live in: ``INFERQ_RATE_LIMIT_REDIS_URL``, else the service's.
    Its own connections time out after a second, so an outage is noticed at once."""
    url = ctx.settings.rate_limit_redis_url
    if not url:
        return ctx.redis
    with _clients_lock:
        r = _clients.get(url)
        if r is None:
            r = _clients[url] = redis.Redis.from_url(url, socket_timeout=1.0,
                                                     socket_connect_timeout=1.0)
        return r


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


def admit(ctx: Context, tenant_id: str, model: str, tokens: int, *, stream: bool = False,
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
        raw = _script(r, DECIDE)(keys=keys, args=args, client=r)
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


_scripts_lock = threading.Lock()
_scripts: dict[tuple[int, str], Any] = {}


def _script(r: redis.Redis, source: str) -> Any:
    key = (id(r), source)
    with _scripts_lock:
        s = _scripts.get(key)
        if s is None:
            s = _scripts[key] = r.register_script(source)
        return s


def settle_member(ctx: Context, tenant_id: str, model: str, member: str, real: int) -> int:
    """Correct a reservation in its tokens window to ``real`` tokens (a refund or a
    charge); a no-op once the reservation has left the window. Returns the change."""
    r = client(ctx)
    _, w, tot = window_keys(tenant_id, model, "tokens")
    try:
        return int(_script(r, SETTLE)(keys=[w, tot], args=[member, max(0, real)], client=r))
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
        _script(r, RENEW)(keys=[streams_key(grant.tenant_id, grant.model)],
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


def usage_tokens(usage: Any) -> int | None:
    """Total tokens of an OpenAI ``usage`` object, None if it has none."""
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return sum(p for p in parts if isinstance(p, int)) if any(
        isinstance(p, int) for p in parts) else None


def body_usage_tokens(body: bytes) -> int | None:
    """The total tokens of a response body that ends with its ``usage`` object (as the
    workers write them), read from its tail without parsing the whole body."""
    at = body.rfind(b'"usage":')
    if at < 0:
        return None
    try:
        return usage_tokens(orjson.loads(body[at + 8:].rstrip()[:-1]))
    except orjson.JSONDecodeError:
        return None


# Batches: input tokens per day ------------------------------------------------------------


def batch_token_error(ctx: Context, s: Session, tenant_id: str, model: str | None,
                      tokens: int, exact: bool = False) -> dict[str, Any] | None:
    """The error that fails a batch whose ``tokens`` (its input's prompt tokens: counted
    by the model's tokenizer when ``exact``, else an upper bound) would push
    the project's batch input tokens for ``model`` in the last day (batches that went
    in progress since) past ``batch_1_day_max_input_tokens``; None when it fits. Takes
    the project's row lock, so concurrent validations of one project are decided one
    after the other: call it in the transaction that moves the batch to in_progress."""
    if model is None:
        return None
    limit = limits_for(ctx, tenant_id, model, ttl_s=0).batch_day_input_tokens
    if limit <= 0:
        return None
    s.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
    since = int(time.time()) - DAY_MS // 1000
    used = s.scalar(select(func.coalesce(func.sum(Batch.input_tokens), 0)).where(
        Batch.tenant_id == tenant_id, Batch.model == model, Batch.in_progress_at >= since)) or 0
    if used + tokens <= limit:
        return None
    holds = f"{tokens:,}" if exact else f"up to {tokens:,}"
    return {"code": "token_limit_exceeded", "line": None, "param": None,
            "message": f"Enqueued token limit reached for {model} in project {tenant_id}. "
                       f"Limit: {limit:,} enqueued tokens; this batch holds {holds} and "
                       f"{int(used):,} were enqueued in the last day. Please try again once "
                       "some in_progress batches have been completed."}
