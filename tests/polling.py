"""The one way tests wait for something that happens in another process: ``until``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], ok: Callable[[T], Any] | None = None, *,
          timeout: float = 120.0, what: str = "the condition", every: float = 0.2) -> T:
    """``check()`` again until its value is true (or, given ``ok``, until ``ok`` of it
    is); that value. Past ``timeout`` seconds the test fails, naming ``what`` and the
    last value seen: a wait never returns a value that did not pass."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if ok(got) if ok is not None else got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last seen: "
                                 f"{str(got)[:300]})")
        time.sleep(every)
