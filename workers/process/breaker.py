"""A circuit breaker for a worker whose model keeps failing.

The engine reports every forward pass. After ``threshold`` failures in a row the
breaker opens: the worker stops taking work (its shard in progress is handed back
uncommitted, its Celery consumers are cancelled, the realtime and jobs lanes stop
reading, and its heartbeat says so) instead of turning every request into an error
or retrying in a storm. After a cooldown it half-opens and takes work again; the
next good pass closes it, the next failure opens it for twice as long.

An engine that broke (vLLM's core died: ``workers.engines.vllm``) trips it at once
(``trip``): nothing that engine held can run until it is rebuilt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from jobs.core.status import BreakerState


class Breaker:
    """``clock`` returns seconds on a monotonic scale (tests pass a fake one)."""

    def __init__(self, threshold: int = 3, cooldown_s: float = 30.0,
                 max_cooldown_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold, self.base, self.max = threshold, cooldown_s, max_cooldown_s
        self.clock = clock
        self.cooldown_s = cooldown_s
        self.failures = 0
        self.opened_at: float | None = None
        self.opens = 0
        self._lock = threading.Lock()
        self.on_open: list[Callable[[float], None]] = []

    @property
    def state(self) -> BreakerState:
        if self.opened_at is None:
            return BreakerState.CLOSED
        if self.clock() - self.opened_at < self.cooldown_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allow(self) -> bool:
        """Whether to take work now; the lanes and the shard pipeline ask before each step."""
        return self.state != BreakerState.OPEN

    def trip(self) -> None:
        """Open now, whatever the count (a broken engine); already open: as it is."""
        with self._lock:
            if self.state == BreakerState.OPEN:
                return
            if self.opened_at is not None:  # half-open: failed again
                self.cooldown_s = min(self.max, self.cooldown_s * 2)
            self.failures = max(self.failures + 1, self.threshold)
            self.opened_at = self.clock()
            self.opens += 1
        for cb in self.on_open:
            cb(self.cooldown_s)

    def record(self, ok: bool) -> None:
        """Called by the engine after every forward pass."""
        opened = False
        with self._lock:
            if ok:
                self.failures = 0
                if self.opened_at is not None and self.state == BreakerState.HALF_OPEN:
                    self.opened_at, self.cooldown_s = None, self.base
                return
            self.failures += 1
            if self.state == BreakerState.HALF_OPEN:
                self.cooldown_s = min(self.max, self.cooldown_s * 2)
                self.opened_at, opened = self.clock(), True
            elif self.opened_at is None and self.failures >= self.threshold:
                self.opened_at, opened = self.clock(), True
            if opened:
                self.opens += 1
        if opened:
            for cb in self.on_open:
                cb(self.cooldown_s)
