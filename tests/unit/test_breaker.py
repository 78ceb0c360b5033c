"""The circuit breaker's states: closed → open after N failures in a row → half-open
after the cooldown → closed on a success, or open for twice as long on a failure."""

from __future__ import annotations

from jobs.core.status import BreakerState
from workers.process.breaker import Breaker


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_breaker_cycle() -> None:
    clock = FakeClock()
    opened: list[float] = []
    b = Breaker(threshold=3, cooldown_s=0.2, max_cooldown_s=1.0, clock=clock)
    b.on_open.append(opened.append)
    b.record(False)
    b.record(False)
    b.record(True)  # a success resets the count
    b.record(False)
    b.record(False)
    assert b.state == BreakerState.CLOSED and b.allow()
    b.record(False)
    assert b.state == BreakerState.OPEN and not b.allow() and opened == [0.2]
    clock.now += 0.19
    assert b.state == BreakerState.OPEN and not b.allow()
    clock.now += 0.02
    assert b.state == BreakerState.HALF_OPEN and b.allow()
    b.record(False)  # the probe failed: open again, for longer
    assert b.state == BreakerState.OPEN and opened == [0.2, 0.4]
    clock.now += 0.39
    assert b.state == BreakerState.OPEN
    clock.now += 0.02
    b.record(True)
    assert b.state == BreakerState.CLOSED and b.cooldown_s == 0.2 and b.opens == 2


def test_cooldown_doubles_up_to_the_maximum() -> None:
    clock = FakeClock()
    opened: list[float] = []
    b = Breaker(threshold=1, cooldown_s=1.0, max_cooldown_s=3.0, clock=clock)
    b.on_open.append(opened.append)
    b.record(False)
    for _ in range(3):  # every failed probe opens it again, for twice as long, capped
        clock.now += b.cooldown_s
        assert b.state == BreakerState.HALF_OPEN
        b.record(False)
    assert opened == [1.0, 2.0, 3.0, 3.0] and b.opens == 4
    assert b.state == BreakerState.OPEN
