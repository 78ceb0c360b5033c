"""Long-lived responses (token streams, batch event streams) of one API process, per
project, against ``api_max_streams_per_project``: one project's followers cannot take
every connection the process holds."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from flask import current_app

from jobs.tenants.limits import RateLimited


class StreamSlots:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, tenant_id: str) -> Callable[[], None]:
        """A slot for one stream of the project (429 past the cap); the returned
        function gives it back, once however often it is called."""
        with self._lock:
            if self.held[tenant_id] >= self.cap:
                raise RateLimited(f"Too many open streams for this project on this server: "
                                  f"at most {self.cap}. Close one or retry shortly",
                                  "requests", {"retry-after": "1"})
            self.held[tenant_id] += 1
        given = False

        def give_back() -> None:
            nonlocal given
            with self._lock:
                if given:
                    return
                given = True
                self.held[tenant_id] -= 1
                if self.held[tenant_id] <= 0:
                    del self.held[tenant_id]
        return give_back


def take(tenant_id: str) -> Callable[[], None]:
    slots: StreamSlots = current_app.extensions["inferq_streams"]
    return slots.take(tenant_id)
