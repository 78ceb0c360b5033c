"""In-process consumers beside the Celery task: the realtime lane and the heartbeat.

The realtime consumer blocks on the Redis realtime queue and feeds the engine at
the highest priority, so interactive requests never wait behind a shard: they
join the engine at its next step while the shard's task keeps running.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import orjson
import redis

from jobs import realtime
from jobs.errors import InferqError
from jobs.requests import parse_embeddings
from workers.engine import REALTIME, Engine
from workers.responses import dumps, embeddings_body

log = logging.getLogger("inferq.lanes")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class RealtimeConsumer(threading.Thread):
    def __init__(self, r: redis.Redis, engine: Engine, tok: Any, max_inputs: int) -> None:
        super().__init__(name="inferq-realtime", daemon=True)
        self.r, self.engine, self.tok, self.max_inputs = r, engine, tok, max_inputs
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                got = self.r.brpop([realtime.QUEUE], timeout=1)
            except redis.RedisError as e:
                log.warning("realtime lane: %s; retrying", e)
                time.sleep(1)
                continue
            if got is not None:
                self.handle(orjson.loads(got[1]))

    def handle(self, msg: dict[str, Any]) -> None:
        rid = msg["id"]
        if msg.get("deadline", 0) < time.time():
            return  # the caller has given up
        try:
            req = parse_embeddings(msg["body"], self.max_inputs)
        except InferqError as e:
            return self.reply(rid, {"status": e.status, "error": _err(e)})
        ids = self.tok.tokenize(req.inputs())
        futures = self.engine.submit(ids, REALTIME)
        ntok = sum(map(len, ids))
        remaining = [len(futures)]
        lock = threading.Lock()

        def done(_: Future[np.ndarray]) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                body = embeddings_body(req, [f.result() for f in futures], ntok)
                self.reply(rid, {"body": orjson.Fragment(dumps(body))})
            except Exception as e:  # noqa: BLE001 - returned to the caller as a 500
                self.reply(rid, {"status": 500, "error": {"message": f"inference failed: {e}",
                                                          "type": "server_error"}})

        for f in futures:
            f.add_done_callback(done)
        return None

    def reply(self, rid: str, payload: dict[str, Any]) -> None:
        key = realtime.reply_key(rid)
        with self.r.pipeline() as p:
            p.lpush(key, orjson.dumps(payload))
            p.expire(key, realtime.REPLY_TTL_S)
            p.execute()


def _err(e: InferqError) -> dict[str, Any]:
    return {"message": e.message, "type": e.type, "param": e.param, "code": e.code}


class Heartbeat(threading.Thread):
    def __init__(self, r: redis.Redis, name: str, info: dict[str, Any], every_s: float) -> None:
        super().__init__(name="inferq-heartbeat", daemon=True)
        self.r, self.name, self.info, self.every_s = r, name, info, every_s
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                realtime.heartbeat(self.r, self.name, self.info, self.every_s * 3)
            except redis.RedisError as e:
                log.warning("heartbeat: %s", e)
            self.stopping.wait(self.every_s)
