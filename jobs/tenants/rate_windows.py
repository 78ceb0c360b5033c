"""The windows of the rate limits in Redis: the Lua scripts that decide, settle and
renew, the keys of a project's windows and stream leases, and the Redis they live in.

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
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from jobs.core import redis_keys
from jobs.core.context import Context

MINUTE_MS = 60_000
DAY_MS = 86_400_000
DAY_BUCKET_MS = 60_000

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


_scripts_lock = threading.Lock()
_scripts: dict[tuple[int, str], Any] = {}


def script(r: redis.Redis, source: str) -> Any:
    key = (id(r), source)
    with _scripts_lock:
        s = _scripts.get(key)
        if s is None:
            s = _scripts[key] = r.register_script(source)
        return s
