"""The realtime lane: interactive requests answered by workers through Redis.

A request is pushed on a Redis list the workers' realtime consumers block on;
the answer comes back on a per-request list the API blocks on. Lists (unlike
pub/sub) keep a reply that arrives before the API starts waiting. A request
carries its deadline; a worker drops requests whose caller has given up.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis

from jobs.errors import InferqError, RequestTimeout, Unavailable
from jobs.models import new_id

QUEUE = "inferq:queue:realtime"
WORKERS = "inferq:workers:"
REPLY_TTL_S = 60


def reply_key(request_id: str) -> str:
    return f"inferq:reply:{request_id}"


def live_workers(r: redis.Redis, lane: str) -> list[dict[str, Any]]:
    """Workers whose heartbeat is current and that serve ``lane``."""
    keys = list(r.scan_iter(match=WORKERS + "*", count=100))
    out = []
    for raw in r.mget(keys) if keys else []:
        if raw:
            info = orjson.loads(raw)
            if lane in info.get("lanes", []):
                out.append(info)
    return out


def heartbeat(r: redis.Redis, name: str, info: dict[str, Any], ttl_s: float) -> None:
    r.set(WORKERS + name, orjson.dumps(info), px=int(ttl_s * 1000))


class RealtimeClient:
    def __init__(self, r: redis.Redis, max_queue: int = 1000) -> None:
        self.r = r
        self.max_queue = max_queue

    def call(self, kind: str, body: dict[str, Any], timeout_s: float) -> bytes:
        """Send one request and wait for the worker's answer (the JSON response body)."""
        if not live_workers(self.r, "realtime"):
            raise Unavailable("no worker is serving the realtime lane", retry_after=5)
        if self.r.llen(QUEUE) >= self.max_queue:
            raise Unavailable("the realtime queue is full", retry_after=2)
        rid = new_id("req_")
        msg = {"id": rid, "kind": kind, "body": body, "deadline": time.time() + timeout_s}
        self.r.lpush(QUEUE, orjson.dumps(msg))
        got = self.r.blpop([reply_key(rid)], timeout=max(1, int(timeout_s)))
        if got is None:
            raise RequestTimeout(f"no answer within {timeout_s:.0f} s")
        reply = orjson.loads(got[1])
        if "error" in reply:
            e = reply["error"]
            err = InferqError(e["message"], e.get("param"), e.get("code"))
            err.status = reply.get("status", 500)
            err.type = e.get("type", "server_error")
            raise err
        return reply["body"].encode() if isinstance(reply["body"], str) else orjson.dumps(
            reply["body"])
