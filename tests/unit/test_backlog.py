"""The batch lanes' scaling arithmetic (``jobs.slo.backlog.workers_needed``): the fewest
workers that commit every row by its batch's deadline, earliest deadline first, at
each model's rows per second per worker."""

from __future__ import annotations

import pytest

from jobs.slo.backlog import Due, Rate, workers_needed

NOW = 1_000_000.0


def test_nothing_due_needs_no_worker() -> None:
    assert workers_needed([], {}, 1.0, NOW) == 0
    assert workers_needed([Due("m", 0, NOW + 60)], {"m": 5.0}, 1.0, NOW) == 0


def test_one_batch_is_its_work_over_the_time_left() -> None:
    # 36,000 rows at 10 rows/s = 3,600 worker-seconds due in 600 s: 6 workers
    assert workers_needed([Due("m", 36_000, NOW + 600)], {"m": 10.0}, 1.0, NOW) == 6
    # one row more does not fit in 6
    assert workers_needed([Due("m", 36_001, NOW + 600)], {"m": 10.0}, 1.0, NOW) == 7


def test_a_little_work_far_ahead_still_needs_one_worker() -> None:
    assert workers_needed([Due("m", 10, NOW + 86_400)], {"m": 10.0}, 1.0, NOW) == 1


def test_deadlines_add_up_earliest_first() -> None:
    """A far deadline's work can be done after the near one's: with 1,000 worker-seconds
    due in 100 s (10 workers) and 1,000 more due in 1,000 s, 10 workers suffice (2,000
    by 1,000 s needs only 2); the near one alone decides."""
    due = [Due("m", 10_000, NOW + 1_000), Due("m", 10_000, NOW + 100)]
    assert workers_needed(due, {"m": 10.0}, 1.0, NOW) == 10
    # work due later counts against the later deadline: 12,000 worker-seconds more by
    # 1,000 s make 14,000 / 1,000 s = 14 workers
    more = [*due, Due("m", 120_000, NOW + 1_000)]
    assert workers_needed(more, {"m": 10.0}, 1.0, NOW) == 14


def test_each_model_at_its_own_rate_and_the_default_for_an_unmeasured_one() -> None:
    due = [Due("fast", 100_000, NOW + 1_000), Due("slow", 2_000, NOW + 1_000)]
    # 100,000 / 500 = 200 s, 2,000 / 2 = 1,000 s: 1,200 worker-seconds in 1,000 s
    assert workers_needed(due, {"fast": 500.0, "slow": 2.0}, 1.0, NOW) == 2
    # slow unmeasured: the default 0.5 rows/s makes it 4,000 s, 4,200 in all
    assert workers_needed(due, {"fast": 500.0}, 0.5, NOW) == 5


def test_rows_without_a_deadline_need_one_worker() -> None:
    assert workers_needed([Due("m", 10**9, None)], {"m": 1.0}, 1.0, NOW) == 1
    both = [Due("m", 10**9, None), Due("m", 3_000, NOW + 1_000)]
    assert workers_needed(both, {"m": 1.0}, 1.0, NOW) == 3


def test_a_deadline_about_to_pass_counts_at_least_a_second() -> None:
    assert workers_needed([Due("m", 50, NOW + 0.2)], {"m": 10.0}, 1.0, NOW) == 5


def test_measured_rate() -> None:
    assert Rate(rows=300, seconds=60.0).per_s == pytest.approx(5.0)
