"""Realtime streams when their worker stops, as real Celery processes of the ``fstack``
(tests/integration/conftest.py) serving SmolLM2 on the transformers engine: a SIGTERM
lets an open stream finish within INFERQ_DRAIN_S (every token, [DONE], no error), and
one that cannot finish ends with a 503 ``worker_stopping`` event at the deadline; a
request taken by a worker killed at once (SIGKILL while it loads the chat model for it,
before its engine had it) is answered by another worker; a stream whose worker is killed
after some tokens ends with 503 ``worker_gone`` within seconds, not after 30 s of
silence."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
import orjson
import pytest

from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.fleet import heartbeats
from jobs.realtime.client import TokenStream
from tests.helpers import served
from tests.polling import until

pytestmark = pytest.mark.slow

SMOL = "SmolLM2-135M-Instruct"
NO_END = {"0": -100, "1": -100, "2": -100}  # <|endoftext|>, <|im_start|>, <|im_end|>
CHAT_ENV = {"INFERQ_CHAT_MODEL": SMOL, "INFERQ_WORKER_HEARTBEAT_S": "1"}


class Sse(threading.Thread):
    """A streamed chat completion through the API, read raw: each ``data:`` payload and
    when it came (monotonic)."""

    def __init__(self, stack: Any, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.stack, self.max_tokens = stack, max_tokens
        self.events: list[tuple[float, Any]] = []
        self.deltas = threading.Semaphore(0)

    def run(self) -> None:
        body = {"model": SMOL, "max_tokens": self.max_tokens, "stream": True,
                "logit_bias": NO_END, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Count from 1 upwards."}]}
        with httpx.stream("POST", self.stack.base_url + "/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {self.stack.api_key}"},
                          timeout=120) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                ev = data if data == "[DONE]" else orjson.loads(data)
                self.events.append((time.monotonic(), ev))
                if isinstance(ev, dict) and any(
                        c.get("delta", {}).get("content") for c in ev.get("choices", [])):
                    self.deltas.release()

    def after(self, n: int) -> None:
        """Wait until ``n`` chunks with text have come."""
        for _ in range(n):
            assert self.deltas.acquire(timeout=300), self.events[-3:]

    def errors(self) -> list[dict[str, Any]]:
        return [ev["error"] for _, ev in self.events if isinstance(ev, dict) and "error" in ev]


def chat_worker(fsdk: Any, workers: Any, name: str, **env: str) -> Any:
    """A realtime worker serving SmolLM2, its engine built (a first request answered)."""
    proc = workers(name, "realtime", **CHAT_ENV, **env)
    served(lambda: fsdk.chat.completions.create(
        model=SMOL, max_tokens=1, messages=[{"role": "user", "content": "hi"}]))
    return proc


def test_a_sigterm_lets_an_open_stream_finish(fstack: Any, fsdk: Any, workers: Any) -> None:
    proc = chat_worker(fsdk, workers, "drain-ok", INFERQ_DRAIN_S="300")  # a loaded CPU
    sse = Sse(fstack, max_tokens=16)
    sse.start()
    sse.after(2)
    os.kill(proc.pid, signal.SIGTERM)  # as an orchestrator stops it: its main process
    sse.join(300)
    assert not sse.is_alive()
    assert sse.errors() == []
    assert sse.events[-1][1] == "[DONE]"
    usage = sse.events[-2][1]["usage"]
    assert usage["completion_tokens"] == 16  # every token (no end token can come)
    assert proc.wait(60) == 0  # it stopped once the stream had ended


def test_a_stream_that_cannot_finish_ends_at_the_drain_deadline(
        fstack: Any, fsdk: Any, workers: Any) -> None:
    proc = chat_worker(fsdk, workers, "drain-short", INFERQ_DRAIN_S="3")
    sse = Sse(fstack, max_tokens=5000)  # minutes of work here
    sse.start()
    sse.after(2)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    sse.join(60)
    assert not sse.is_alive()
    [err] = sse.errors()
    assert err["code"] == "worker_stopping" and err["type"] == "server_error", err
    assert sse.events[-1][1] == "[DONE]"
    ended = next(t for t, ev in sse.events if isinstance(ev, dict) and "error" in ev)
    assert 2 < ended - t0 < 25, ended - t0  # at the drain's deadline, not before
    proc.wait(60)


def _taken_by(ctx: Context, rid: str) -> str | None:
    """The worker whose taken list holds request ``rid``."""
    for name in ctx.redis.smembers(redis_keys.REALTIME_TAKERS):
        worker = name.decode()
        if any(orjson.loads(raw)["id"] == rid
               for raw in ctx.redis.lrange(redis_keys.realtime_taken(worker), 0, -1)):
            return worker
    return None


def test_a_request_taken_by_a_worker_killed_at_once_is_answered_by_another(
        fstack: Any, fctx: Context, workers: Any) -> None:
    """The first chat request makes a worker build its engine (the model loaded then):
    killed while it does, the request it took had reached no engine. Its lease lapses,
    the request goes back to its queue, and a worker started after the kill answers it."""
    first = workers("taker", "realtime", **CHAT_ENV)
    until(lambda: heartbeats.live_workers(fctx.redis, "realtime", SMOL), timeout=180,
          what="the first worker serving the model")
    ts = TokenStream(fctx.redis, "/v1/chat/completions", {
        "model": SMOL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        first_event_s=150, idle_s=60)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(ts.open()), daemon=True)
    t0 = time.monotonic()
    t.start()
    worker = until(lambda: _taken_by(fctx, ts.id), timeout=60, every=0.01,
                   what="the request taken")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert not fctx.redis.sismember(redis_keys.realtime_started(worker), ts.id), (
        "the engine had it before the kill: this test needs it killed before")
    workers("taker-2", "realtime", **CHAT_ENV)
    t.join(150)
    assert got and got[0]["t"] == "start", got
    done = [ev for ev in ts.events() if ev is not None]
    ts.close()
    assert done[-1]["t"] == "done" and done[-1]["completion_tokens"] >= 1, done
    assert time.monotonic() - t0 < 150
    assert _taken_by(fctx, ts.id) is None


def test_a_stream_whose_worker_is_killed_ends_within_seconds(
        fstack: Any, fsdk: Any, workers: Any) -> None:
    proc = chat_worker(fsdk, workers, "killed")
    sse = Sse(fstack, max_tokens=5000)
    sse.start()
    sse.after(3)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    sse.join(60)
    assert not sse.is_alive()
    [err] = sse.errors()
    assert err["code"] == "worker_gone", err
    assert sse.events[-1][1] == "[DONE]"
    ended = next(t for t, ev in sse.events if isinstance(ev, dict) and "error" in ev)
    assert ended - t0 < 15, ended - t0  # its lease (6 s) and a reap, not 30 s of silence
