"""Many subscribers, one Redis pub/sub connection per process.

A process that reads thousands of token streams at once (the API) does not open a
connection per stream: :func:`hub` gives every caller of one Redis client the same
:class:`Hub`, whose reader thread (a greenlet under the API's gevent server) takes
every message off the one connection and hands it to its channel's subscriber.
Subscribing waits for the server's confirmation, so a publisher told to start after
``subscribe`` returns loses nothing. If the connection breaks, every subscriber's
next read raises the error (a stream cannot know what it missed) and the next
subscription opens a new connection.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from typing import Any

import redis

log = logging.getLogger("inferq.pubsub")
_POLL_S = 1.0  # the reader's wait for a message, between looks at its subscriptions


class Subscription:
    """One channel's messages, in order."""

    def __init__(self, hub: Hub, channel: str) -> None:
        self.hub, self.channel = hub, channel
        self.inbox: queue.SimpleQueue[bytes | Exception] = queue.SimpleQueue()
        self.confirmed = threading.Event()

    def get(self, timeout: float) -> bytes | None:
        """The next message, or None when none came within ``timeout``."""
        try:
            item = self.inbox.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.hub.unsubscribe(self)


class Hub:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._lock = threading.Lock()
        self._subs: dict[str, Subscription] = {}
        self._pubsub: Any = None
        self.pid = os.getpid()

    def subscribe(self, channel: str, timeout: float = 5.0) -> Subscription:
        """A subscription to ``channel``, confirmed by the server (``TimeoutError`` if
        it is not within ``timeout``; a Redis error as it comes)."""
        sub = Subscription(self, channel)
        with self._lock:
            if self._pubsub is None:
                self._pubsub = self.r.pubsub(ignore_subscribe_messages=False)
                self._pubsub.subscribe(channel)
                threading.Thread(target=self._read, args=(self._pubsub,),
                                 name="inferq-pubsub", daemon=True).start()
            else:
                self._pubsub.subscribe(channel)
            self._subs[channel] = sub
        if not sub.confirmed.wait(timeout):
            sub.close()
            raise TimeoutError(f"the subscription to {channel} was not confirmed")
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if self._subs.get(sub.channel) is not sub:
                return
            del self._subs[sub.channel]
            ps = self._pubsub
        if ps is not None:
            try:
                ps.unsubscribe(sub.channel)
            except (redis.RedisError, OSError):
                pass  # a broken connection: the reader fails it and starts anew

    def subscribers(self) -> int:
        with self._lock:
            return len(self._subs)

    def _read(self, ps: Any) -> None:
        while True:
            try:
                msg = ps.get_message(timeout=_POLL_S)
            except Exception as e:  # noqa: BLE001 - any failure ends this connection
                self._broken(ps, e)
                return
            if msg is None:
                continue
            channel = msg["channel"].decode() if isinstance(msg["channel"], bytes) \
                else str(msg["channel"])
            with self._lock:
                sub = self._subs.get(channel)
            if sub is None:
                continue
            if msg["type"] == "subscribe":
                sub.confirmed.set()
            elif msg["type"] == "message":
                sub.inbox.put(msg["data"])

    def _broken(self, ps: Any, e: Exception) -> None:
        log.warning("pub/sub connection lost: %s", e)
        with self._lock:
            if self._pubsub is ps:
                self._pubsub = None
            subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            sub.inbox.put(e if isinstance(e, redis.RedisError) else redis.ConnectionError(str(e)))
            sub.confirmed.set()
        try:
            ps.close()
        except Exception:  # noqa: BLE001
            pass


_hubs: weakref.WeakKeyDictionary[Any, Hub] = weakref.WeakKeyDictionary()
_hubs_lock = threading.Lock()


def hub(r: redis.Redis) -> Hub:
    """The hub of ``r``'s connection pool (one per pool, so per process and server)."""
    pool = r.connection_pool
    with _hubs_lock:
        h = _hubs.get(pool)
        if h is None or h.pid != os.getpid():  # a forked child reads with threads of its own
            h = _hubs[pool] = Hub(r)
        return h
