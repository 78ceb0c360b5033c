"""The circuit breaker's states: closed → open after N failures in a row → half-open
after the cooldown → closed on a success, or open for twice as long on a failure."""

from __future__ import annotations

import time

from workers.breaker import Breaker


def test_breaker_cycle() -> None:
    opened: list[float] = []
    b = Breaker(threshold=3, cooldown_s=0.2, max_cooldown_s=1.0)
    b.on_open.append(opened.append)
    b.record(False)
    b.record(False)
    b.record(True)  # a success resets the count
    b.record(False)
    b.record(False)
    assert b.state == "closed" and b.allow()
    b.record(False)
    assert b.state == "open" and not b.allow() and opened == [0.2]
    time.sleep(0.25)
    assert b.state == "half_open" and b.allow()
    b.record(False)  # the probe failed: open again, for longer
    assert b.state == "open" and opened == [0.2, 0.4]
    time.sleep(0.45)
    b.record(True)
    assert b.state == "closed" and b.cooldown_s == 0.2 and b.opens == 2
