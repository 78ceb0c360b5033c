"""Where model versions are resident, and deciding where one is loaded.

Each model worker reports in its heartbeat the versions it holds (``resident``, as
``name@version``), its model memory budget and what its engines have waiting
(``residency``). Requests and shards for a version are routed to the queues of that
version, which only workers holding it consume (jobs.realtime.client, jobs.asyncjobs.lifecycle,
jobs.core.dispatch). When no live worker of the lane holds a version asked for,
``ensure`` picks the least-loaded worker with room (a worker whose budget would be
exceeded unloads its least recently used versions first) and sends it a load command;
the request waits on the version's queue until the copy is loaded. That is a cold
start: counted per version in Redis (``record_load``) and in the loading worker's
``inferq_model_loads`` counter. One placement per version is in progress at a time
(``placing``: a marker with a TTL).

Work for a version that cannot be had (its load failed, it is not registered, no live
worker has room for it) ends with ``model_not_loaded``. The decision is made again
for as long as the work waits, so a late heartbeat only delays it: a job within one
janitor sweep (``janitor_interval_s``) of a worker of its lane being live, plus the
time the load takes to fail; a realtime request within a second of the placement
saying no (``jobs.realtime.client.PLACEMENT_CHECK_S``). While no worker of the lane is live
its work waits, whatever its version (a heartbeat late is no reason to refuse it).

Warm pools (``reconcile``, on every janitor sweep): a version with ``min_resident``
copies gets them on live workers (after a restart or a scale-in too), and a copy
beyond that minimum unused for the version's ``idle_unload_s`` is unloaded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson
import redis
from sqlalchemy import select

from jobs.core import redis_keys, refs
from jobs.core.context import Context
from jobs.core.lanes import MODEL_LANES
from jobs.core.schema import Model
from jobs.fleet import registry
from jobs.fleet.heartbeats import Heartbeat, live_workers

log = logging.getLogger("inferq.placement")

COMMANDS, PLACING, FAILED = (redis_keys.MODEL_COMMANDS, redis_keys.PLACING,
                             redis_keys.LOAD_FAILED)
LOADS, LAST_LOADS = redis_keys.MODEL_LOADS, redis_keys.MODEL_LOADS_RECENT
PLACING_TTL_S = 120
# A version whose load failed is not placed again for this long: its work is routed to
# the lane's common queue meanwhile, where any worker refuses it (503 model_not_loaded).
FAILED_TTL_S = 300


def command_list(worker: str) -> str:
    return COMMANDS + worker


def placing_key(model_ref: str) -> str:
    return PLACING + model_ref


def pool_key(model_ref: str, worker: str) -> str:
    """A warm pool's load of ``model_ref`` sent to ``worker`` and not done yet."""
    return f"{PLACING}{model_ref}|{worker}"


def placed(r: redis.Redis, model_ref: str, worker: str = "") -> None:
    """A load of ``model_ref`` on ``worker`` ended (loaded or refused): another placement
    may start."""
    r.delete(placing_key(model_ref), pool_key(model_ref, worker))


def record_load(r: redis.Redis, worker: str, model_ref: str, reason: str,
                seconds: float) -> None:
    """Count one load of ``model_ref`` on ``worker`` (best effort: a lost count only
    hides a load from ``inferq models list``)."""
    try:
        with r.pipeline() as p:
            p.hincrby(LOADS, f"{model_ref}|{reason}", 1)
            p.lpush(LAST_LOADS, orjson.dumps({"worker": worker, "ref": model_ref,
                                              "reason": reason, "seconds": seconds,
                                              "at": time.time()}))
            p.ltrim(LAST_LOADS, 0, 199)
            p.execute()
    except redis.RedisError as e:
        log.warning("load of %s not counted: %s", model_ref, e)


def load_counts(r: redis.Redis) -> dict[str, dict[str, int]]:
    """Loads so far: ref -> reason -> count."""
    out: dict[str, dict[str, int]] = {}
    for k, v in r.hgetall(LOADS).items():
        key = k.decode() if isinstance(k, bytes) else str(k)
        ref, _, reason = key.rpartition("|")
        out.setdefault(ref, {})[reason] = int(v)
    return out


# The fleet as heartbeats describe it ---------------------------------------------------


def resident(info: Heartbeat) -> list[str]:
    """The versions a heartbeat's worker holds (a worker that reports no ``resident``
    announces names only)."""
    return list(info.get("resident", info.get("models", [])))


def loading(info: Heartbeat) -> list[str]:
    return list((info.get("residency") or {}).get("loading", []))


def holders(beats: Iterable[Heartbeat], model_ref: str) -> list[Heartbeat]:
    return [b for b in beats if model_ref in resident(b)]


@dataclass(frozen=True)
class Choice:
    worker: str
    evict: tuple[str, ...]  # what it will unload first to make room (LRU order)


def choose(beats: Sequence[Heartbeat], model_ref: str, size: int) -> Choice | None:
    """The worker to load ``model_ref`` (``size`` bytes) on: among live workers that do
    not hold it and whose budget can take it (after unloading their least recently
    used versions), the least loaded (engine work waiting), then the one that would
    evict least, then by name. None when no worker has room even empty."""
    best: tuple[tuple[int, int, int, str], Choice] | None = None
    for b in beats:
        if model_ref in resident(b) or model_ref in loading(b):
            continue
        res = b.get("residency") or {}
        budget = int(res.get("budget_bytes") or 0)
        if budget and size > budget:
            continue
        lru = sorted(res.get("models", []), key=lambda m: m.get("last_used", 0))
        used = sum(int(m.get("bytes", 0)) for m in lru)
        evict: list[str] = []
        while budget and used + size > budget and lru:
            m = lru.pop(0)
            evict.append(str(m["ref"]))
            used -= int(m.get("bytes", 0))
        key = (int(res.get("busy", 0)), len(evict), len(resident(b)), str(b["name"]))
        if best is None or key < best[0]:
            best = (key, Choice(str(b["name"]), tuple(evict)))
    return best[1] if best else None


def command(r: redis.Redis, worker: str, op: str, model_ref: str, reason: str) -> None:
    r.rpush(command_list(worker), orjson.dumps({"op": op, "ref": model_ref,
                                                "reason": reason}))


def ensure(ctx: Context, model_ref: str, lane: str) -> bool:
    """Have ``model_ref`` resident on a live worker of ``lane``: True when one holds it
    or is loading it, a placement of it is in progress on a live worker, a load was
    sent now, or no worker of the lane is live to decide on (its work waits on the
    version's queue, never rerouted by a heartbeat that is late); False when its last
    load failed, it is not registered, or no live worker has room for it.

    Work waiting on a version's queue is decided on again until it is taken: jobs by
    every janitor sweep (``jobs.asyncjobs.lifecycle.place_waiting``), shards when the janitor
    sends them again, a realtime request every second of its wait
    (``jobs.realtime.client``). So a placement sent to a worker that died, or decided just
    before the version's load failed, is made again or refused there."""
    r = ctx.redis
    beats = live_workers(r, lane)
    if any(model_ref in resident(b) or model_ref in loading(b) for b in beats):
        return True
    if r.exists(FAILED + model_ref):
        return False  # (asked before the marker of the placement that failed is cleared)
    if not beats:  # none to decide on now (restarting, or a heartbeat late): it waits
        return True  # on its version's queue; the next sweep (or request) places it
    if (placing := r.get(placing_key(model_ref))) is not None:
        worker = placing.decode() if isinstance(placing, bytes) else str(placing)
        if any(b["name"] == worker for b in beats):
            return True  # on its way
        r.delete(placing_key(model_ref))  # its worker died before it loaded: again
    name, version = refs.split_ref(model_ref)
    m = registry.get(ctx, name, version) if version else registry.get_default(ctx, name)
    if m is None:
        return False
    choice = choose(beats, model_ref, registry.total_bytes(m))
    if choice is None:
        log.warning("no %s worker has room for %s", lane, model_ref)
        return False
    if not r.set(placing_key(model_ref), choice.worker, nx=True, ex=PLACING_TTL_S):
        return True  # another process placed it meanwhile
    command(r, choice.worker, "load", model_ref, "placement")
    log.info("placing %s on %s (evicting %s)", model_ref, choice.worker,
             ", ".join(choice.evict) or "nothing")
    return True


def load_failed(ctx: Context, model_ref: str, message: str) -> None:
    """A worker could not load ``model_ref``: it is not placed again for
    ``FAILED_TTL_S``, and the jobs waiting on its list go to the common list, where a
    worker refuses them with the request's own error (its shards are sent again by
    ``jobs.batches.fairshare.load_failed``; the realtime requests waiting on it are
    answered by the worker that failed)."""
    r = ctx.redis
    r.set(FAILED + model_ref, message[:500], ex=FAILED_TTL_S)
    while r.lmove(redis_keys.jobs_queue(model_ref), redis_keys.JOBS_QUEUE, "LEFT", "RIGHT"):
        pass


def failure(r: redis.Redis, model_ref: str) -> str | None:
    """Why the last load of ``model_ref`` failed (``"<exception type>: <message>"``),
    within ``FAILED_TTL_S``."""
    got = r.get(FAILED + model_ref)
    return got.decode() if isinstance(got, bytes) else got


# Warm pools ------------------------------------------------------------------------------


def model_workers(r: redis.Redis) -> list[Heartbeat]:
    """Live workers serving any model lane."""
    seen: dict[str, Heartbeat] = {}
    for lane in MODEL_LANES:
        for b in live_workers(r, lane):
            seen.setdefault(str(b["name"]), b)
    return list(seen.values())


def reconcile(ctx: Context, now: float | None = None) -> list[tuple[str, str, str]]:
    """Bring every version's resident copies to its warm pool: load missing minimum
    copies, unload extra copies idle for longer than the version's ``idle_unload_s``.
    Returns the commands sent (op, worker, ref)."""
    t = time.time() if now is None else now
    r = ctx.redis
    beats = model_workers(r)
    if not beats:
        return []
    with ctx.db.session() as s:
        pools = list(s.execute(select(Model.name, Model.version, Model.min_resident,
                                      Model.idle_unload_s, Model.files)
                               .where((Model.min_resident > 0)
                                      | Model.idle_unload_s.is_not(None))))
    sent: list[tuple[str, str, str]] = []
    for name, version, minimum, idle_s, files in pools:
        ref = refs.model_ref(name, version)
        copies = holders(beats, ref)
        pending = [b for b in beats if ref in loading(b) and b not in copies
                   or r.exists(pool_key(ref, str(b["name"])))]
        missing = minimum - len(copies) - len(pending)
        size = sum(int(f["bytes"]) for f in files)
        candidates = [b for b in beats if b not in copies and b not in pending]
        while missing > 0 and candidates:
            choice = choose(candidates, ref, size)
            if choice is None:
                break
            r.set(pool_key(ref, choice.worker), b"1", ex=PLACING_TTL_S)
            command(r, choice.worker, "load", ref, "warm_pool")
            sent.append(("load", choice.worker, ref))
            candidates = [b for b in candidates if b["name"] != choice.worker]
            missing -= 1
        if idle_s is not None and len(copies) > minimum:
            idle = sorted((m.get("last_used", t), b["name"]) for b in copies
                           for m in (b.get("residency") or {}).get("models", [])
                           if m.get("ref") == ref and t - m.get("last_used", t) > idle_s)
            for _, worker in idle[:len(copies) - minimum]:
                command(r, worker, "unload", ref, "idle")
                sent.append(("unload", worker, ref))
    return sent


def engines(r: redis.Redis) -> dict[str, list[str]]:
    """ref -> the generation engines live workers run it on (those that loaded it)."""
    out: dict[str, set[str]] = {}
    for b in model_workers(r):
        for ref, engine in (b.get("engines") or {}).items():
            out.setdefault(str(ref), set()).add(str(engine))
    return {k: sorted(v) for k, v in out.items()}


def where(r: redis.Redis) -> dict[str, list[str]]:
    """ref -> the live workers holding it (for /v1/models and ``inferq models list``)."""
    out: dict[str, list[str]] = {}
    for b in model_workers(r):
        for ref in resident(b):
            out.setdefault(ref, []).append(str(b["name"]))
    return {k: sorted(v) for k, v in out.items()}
