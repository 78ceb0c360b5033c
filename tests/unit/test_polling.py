"""The tests' one wait fails on timeout, and returns the value that passed."""

from __future__ import annotations

import itertools

import pytest

from tests.polling import until


def test_it_returns_the_first_value_that_passes() -> None:
    n = itertools.count()
    assert until(lambda: next(n) >= 3 and "done", every=0) == "done"
    m = itertools.count()
    assert until(lambda: next(m), lambda v: v == 2, every=0) == 2


def test_it_fails_on_timeout_naming_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match="the answer: not within 0.05 s .*last seen: 0"):
        until(lambda: 0, timeout=0.05, what="the answer", every=0.01)
