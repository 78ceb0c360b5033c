"""The worker's heartbeat: who it is (lanes, models, breaker) and its engines' counters,
announced in Redis every few seconds; the API routes realtime work to live workers."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import redis

from jobs.core.settings import MISSED_BEATS
from jobs.fleet import heartbeats

log = logging.getLogger("inferq.heartbeat")


def worker_name() -> str:
    """This process's name in heartbeats, leases and job rows."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat(threading.Thread):
    """Announces ``describe()`` (plus the time) every ``every_s``; it expires after three
    missed beats, so a dead worker disappears on its own, and the janitor then breaks
    the leases of the shards it held (``jobs.batches.janitor``)."""

    def __init__(self, r: redis.Redis, name: str, describe: Callable[[], dict[str, Any]],
                 every_s: float) -> None:
        super().__init__(name="inferq-heartbeat", daemon=True)
        self.r, self.name, self.describe, self.every_s = r, name, describe, every_s
        self.stopping = threading.Event()
        self._wake = threading.Event()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def poke(self) -> None:
        """Beat now rather than at the next tick: what the worker holds changed, and
        placement reads it from here."""
        self._wake.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                beat = cast(heartbeats.Heartbeat, {**self.describe(), "at": time.time()})
                heartbeats.write(self.r, self.name, beat, self.every_s * MISSED_BEATS)
            except Exception as e:  # noqa: BLE001 - a heartbeat must outlive any error
                log.warning("heartbeat: %s", e)
            self._wake.wait(self.every_s)
            self._wake.clear()
