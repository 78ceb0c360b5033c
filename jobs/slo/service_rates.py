"""What the workers measure of their realtime service, for the queueing model
(``jobs.slo.queueing``): per model, a worker's service rate μ, the spread of its service
times and its servers (``ServiceMeter``, announced in its heartbeat), and those combined
over the live workers holding the model (``servers_of``)."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from jobs.fleet.heartbeats import Heartbeat


class ServiceMeter:
    """A worker's service measurements per model over the last ``window_s``: each
    answered realtime request's engine time (``busy_s``) and the service until its
    first answer (``first_s``). ``snapshot()`` is what the heartbeat announces."""

    def __init__(self, window_s: float = 30.0, maxlen: int = 20_000) -> None:
        self.window_s = window_s
        self.maxlen = maxlen
        self._seen: dict[str, deque[tuple[float, float, float]]] = {}
        self._servers: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, model: str, busy_s: float, first_s: float, servers: int = 1) -> None:
        with self._lock:
            self._seen.setdefault(model, deque(maxlen=self.maxlen)).append(
                (time.monotonic(), busy_s, first_s))
            self._servers[model] = servers

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per model: ``rate`` (μ, requests/s per server while busy), ``scv`` (the
        squared coefficient of variation of the service times), ``first_s`` (the mean
        service until a first answer), ``servers`` and the ``requests`` measured."""
        cut = time.monotonic() - self.window_s
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for model, seen in self._seen.items():
                while seen and seen[0][0] < cut:
                    seen.popleft()
                busy = sum(b for _, b, _ in seen)
                if not seen or busy <= 0:
                    continue
                mean = busy / len(seen)
                var = sum((b - mean) ** 2 for _, b, _ in seen) / len(seen)
                out[model] = {"rate": len(seen) / busy, "servers": self._servers[model],
                              "scv": var / mean ** 2 if len(seen) > 1 else 1.0,
                              "first_s": sum(f for _, _, f in seen) / len(seen),
                              "requests": len(seen)}
        return out


@dataclass(frozen=True)
class Servers:
    """A model's servers on the lane, from the live workers' heartbeats."""

    workers: int  # live workers holding the model
    servers_per_worker: float  # mean over the workers
    mu: float | None  # requests/s per server; None until some worker measured it
    first_s: float  # the mean service until a first answer
    scv: float = 1.0  # the service times' squared coefficient of variation

    @property
    def c(self) -> int:
        return max(1, round(self.workers * self.servers_per_worker))


def servers_of(heartbeats: list[Heartbeat], model: str) -> Servers:
    """Combine the live workers' ``service`` reports for ``model``: μ weighted by the
    requests each measured (workers not yet measured are counted as servers at that μ)."""
    measured = [h["service"][model] for h in heartbeats
                if isinstance(h.get("service"), dict) and model in h["service"]]
    n = sum(m["requests"] for m in measured)
    if not measured or n <= 0:
        return Servers(len(heartbeats), 1.0, None, 0.0)
    mu = sum(m["rate"] * m["requests"] for m in measured) / n
    first = sum(m["first_s"] * m["requests"] for m in measured) / n
    per = sum(m["servers"] for m in measured) / len(measured)
    scv = sum(float(m.get("scv", 1.0)) * m["requests"] for m in measured) / n
    return Servers(len(heartbeats), per, mu, first, scv)
