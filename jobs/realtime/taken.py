"""Realtime requests taken by a worker and not yet answered, so that none is lost with
its worker.

A worker moves a request from its queue into its own list of taken requests
(``redis_keys.realtime_taken``) in one atomic step, and removes it when the request is
answered or ended. A generation handed to its engine is also marked started
(``redis_keys.realtime_started``): its tokens may have begun to reach the client. While
its realtime lane lives the worker keeps a short lease (``redis_keys.realtime_lease``).

When a worker's lease lapses (it was killed, or lost Redis for ``LEASE_TTL_S``), the
reaper (``reap``: every live realtime worker runs it each second, and the janitor at each
sweep) empties its list, each entry in one atomic step:
- a request that was not started goes back to the head of the queue it came from, for
  another worker (nothing of it reached the client: giving it again cannot answer twice);
- a started one ends at once: a ``worker_gone`` error event on its token stream, which
  the API's stream takes as its last event (it cannot be run again without sending the
  client a second answer);
- one whose caller has given up (past its deadline) is dropped.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import orjson
import redis

from jobs.core import redis_keys, refs
from jobs.core.errors import InferqError
from jobs.core.status import StreamEvent

log = logging.getLogger("inferq.realtime")

LEASE_TTL_S = 6.0  # a worker's lease lapses after this long without renewal
LEASE_EVERY_S = 1.0  # how often a live worker renews its lease (and reaps the dead's)


class WorkerGone(InferqError, status=503, type="server_error", code="worker_gone"):
    """The worker serving a started generation stopped (killed or cut off) before its end."""


class WorkerStopping(InferqError, status=503, type="server_error", code="worker_stopping"):
    """The worker serving a generation was stopping and could not finish it in time."""


def gone() -> WorkerGone:
    return WorkerGone("the worker serving this request stopped before its answer ended "
                      "(killed or cut off); it is not run again, which would send a second "
                      "answer: retry the request")


def gone_event() -> bytes:
    """The event the reaper publishes on a started stream whose worker is gone: it has
    no sequence number (``gone``: the API takes it as the stream's end, whatever came
    before it)."""
    e = gone()
    return orjson.dumps({"t": StreamEvent.ERROR, "status": e.status, "error": e.to_dict(),
                         "gone": True})


# Move up to ARGV[1] requests of the first of KEYS[2..] that holds one into KEYS[1]:
# {queue, message, message...} or nil.
TAKE = """
for i = 2, #KEYS do
  local got = {}
  for _ = 1, tonumber(ARGV[1]) do
    local raw = redis.call('RPOP', KEYS[i])
    if not raw then break end
    redis.call('LPUSH', KEYS[1], raw)
    got[#got + 1] = raw
  end
  if #got > 0 then return {KEYS[i], unpack(got)} end
end
return nil
"""

# Mark a taken request started (KEYS: taken, started; ARGV: message, id): 0 when it is no
# longer this worker's (a reaper gave it to another).
START = """
if not redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""

# Give a taken request back to the head of its queue (KEYS: taken, queue; ARGV: message).
GIVE_BACK = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
"""

# Reap one request of a gone worker (KEYS: taken, started, queue; ARGV: message, id,
# channel, event, expired): 0 someone else had it, 1 given back, 2 ended, 3 dropped.
REAP = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if redis.call('SREM', KEYS[2], ARGV[2]) == 1 then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 2
end
if ARGV[5] == '1' then return 3 end
redis.call('RPUSH', KEYS[3], ARGV[1])
return 1
"""

# Forget a worker that holds nothing and has no lease (KEYS: taken, started, lease,
# takers; ARGV: name).
FORGET_WORKER = """
if redis.call('EXISTS', KEYS[3]) == 1 or redis.call('LLEN', KEYS[1]) > 0 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
"""


class Reaped(NamedTuple):
    given_back: int = 0
    ended: int = 0
    dropped: int = 0


class Taken(NamedTuple):
    """What the reaper reads of a taken message."""

    id: str
    queue: str  # where it was pushed, and goes back to
    deadline: float


def read(raw: bytes) -> Taken:
    """A taken message's id, queue and deadline (empty for one that cannot be read: it is
    dropped). A message without ``queue`` (pushed by an older API) goes back to its
    version's queue, or its name's."""
    try:
        msg: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Taken("", "", 0.0)
    if not isinstance(msg, dict):
        return Taken("", "", 0.0)
    rid, queue, deadline = msg.get("id"), msg.get("queue"), msg.get("deadline")
    if not isinstance(queue, str):
        body, version = msg.get("body"), msg.get("version")
        model = body.get("model") if isinstance(body, dict) else None
        queue = (redis_keys.realtime_queue(refs.model_ref(model, version) if isinstance(
            version, str) else model) if isinstance(model, str) else "")
    return Taken(rid if isinstance(rid, str) else "", queue,
                 float(deadline) if isinstance(deadline, int | float) else 0.0)


def empty(r: redis.Redis, worker: str) -> Reaped:
    """Empty ``worker``'s taken list (see the module's doc), whatever its lease says: the
    reaper's step for a gone worker, and a stopping worker's own last step."""
    taken, started = redis_keys.realtime_taken(worker), redis_keys.realtime_started(worker)
    reap = r.register_script(REAP)
    counts = [0, 0, 0, 0]
    now = time.time()
    for raw in r.lrange(taken, 0, -1):
        t = read(raw.encode() if isinstance(raw, str) else raw)
        lost = t.deadline < now or not t.queue
        got = int(reap(keys=[taken, started, t.queue or taken],
                       args=[raw, t.id, redis_keys.stream(t.id), gone_event(),
                             "1" if lost else "0"]))
        counts[got] += 1
    return Reaped(*counts[1:])


def reap(r: redis.Redis) -> dict[str, Reaped]:
    """Empty the taken lists of the workers whose lease lapsed; what was done, by worker.
    Nothing while Redis has been up for less than a lease (leases lost in a restart are
    about to be renewed)."""
    names = sorted(x.decode() if isinstance(x, bytes) else x
                   for x in r.smembers(redis_keys.REALTIME_TAKERS))
    if not names or float(r.info("server")["uptime_in_seconds"]) < LEASE_TTL_S:
        return {}
    leases = r.mget([redis_keys.realtime_lease(n) for n in names])
    forget = r.register_script(FORGET_WORKER)
    out: dict[str, Reaped] = {}
    for name, lease in zip(names, leases, strict=True):
        if lease is not None:
            continue
        done = empty(r, name)
        if any(done):
            out[name] = done
            log.warning("realtime requests of %s, whose lane is gone: %d given to another "
                        "worker, %d started ones ended (worker_gone), %d past their deadline "
                        "dropped", name, *done)
        forget(keys=[redis_keys.realtime_taken(name), redis_keys.realtime_started(name),
                     redis_keys.realtime_lease(name), redis_keys.REALTIME_TAKERS], args=[name])
    return out
