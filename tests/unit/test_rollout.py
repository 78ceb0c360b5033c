"""The split of a name's traffic between its versions (jobs.fleet.rollout) and the choice of
the worker that loads a version (jobs.fleet.placement.choose): pure functions, no backends."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from jobs.fleet.placement import choose
from jobs.fleet.rollout import Plan, Router


def picks(router: Router, plan: Plan, n: int) -> list[str | None]:
    return [router.route(plan).version for _ in range(n)]


def test_a_canary_gets_its_weight_within_one_request() -> None:
    plan = Plan("m", "1", canaries=(("2", 0.05),))
    got = picks(Router(), plan, 1000)
    assert Counter(got) == {"1": 950, "2": 50}
    for start in range(0, 1000, 100):  # spread out, not in a burst: 5 in every 100
        assert got[start:start + 100].count("2") == 5


@pytest.mark.parametrize("weights", [(0.3,), (0.2, 0.25), (0.01,), (0.999,)])
def test_any_split_holds_over_any_prefix(weights: tuple[float, ...]) -> None:
    plan = Plan("m", "1", canaries=tuple((f"c{i}", w) for i, w in enumerate(weights)))
    router, seen = Router(), Counter[str | None]()
    for n in range(1, 2001):
        seen[router.route(plan).version] += 1
        for i, w in enumerate(weights):
            assert abs(seen[f"c{i}"] - n * w) <= 1.0 + 1e-9, (n, seen)


def test_rolling_back_stops_the_canary_at_the_next_request() -> None:
    router = Router()
    canary = Plan("m", "1", canaries=(("2", 0.5),))
    assert set(picks(router, canary, 10)) == {"1", "2"}
    assert set(picks(router, Plan("m", "1"), 100)) == {"1"}
    promoted = Plan("m", "2")
    assert set(picks(router, promoted, 100)) == {"2"}


def test_shadows_mirror_their_share_of_the_default_versions_requests() -> None:
    plan = Plan("m", "1", canaries=(("3", 0.5),), shadows=(("2", 0.1),))
    router = Router()
    routes = [router.route(plan) for _ in range(2000)]
    default = [r for r in routes if r.version == "1"]
    assert len(default) == 1000
    assert sum(r.shadows == ("2",) for r in default) == 100
    assert all(r.shadows == () for r in routes if r.version == "3")


def test_a_name_the_registry_does_not_hold_has_no_version() -> None:
    assert Router().route(None).version is None


MB = 1 << 20


def worker(name: str, held: list[tuple[str, int, float]], budget_mb: int = 0, busy: int = 0,
           loading: list[str] | None = None) -> dict[str, Any]:
    """A heartbeat: versions held as (ref, MiB, last used)."""
    return {"name": name, "resident": [h[0] for h in held], "residency": {
        "budget_bytes": budget_mb * MB, "busy": busy, "loading": loading or [],
        "models": [{"ref": r, "bytes": mb * MB, "last_used": t} for r, mb, t in held]}}


def test_the_least_loaded_worker_with_room_loads_it() -> None:
    beats = [worker("a", [("x@1", 100, 1.0)], 250, busy=5),
             worker("b", [("y@1", 100, 1.0)], 250, busy=1),
             worker("c", [], 50, busy=0)]  # no room even empty
    got = choose(beats, "z@1", 100 * MB)
    assert got is not None and (got.worker, got.evict) == ("b", ())


def test_a_full_worker_evicts_its_least_recently_used_versions() -> None:
    beats = [worker("a", [("x@1", 100, 5.0), ("y@1", 100, 2.0)], 200),
             worker("b", [("u@1", 100, 9.0), ("v@1", 100, 8.0)], 200, busy=3)]
    got = choose(beats, "z@1", 100 * MB)
    assert got is not None and (got.worker, got.evict) == ("a", ("y@1",))
    two = choose(beats, "big@1", 200 * MB)
    assert two is not None and (two.worker, two.evict) == ("a", ("y@1", "x@1"))


def test_eviction_is_avoided_when_a_worker_has_room() -> None:
    beats = [worker("a", [("x@1", 100, 1.0), ("y@1", 100, 1.0)], 200),
             worker("b", [("u@1", 100, 1.0)], 200, busy=0)]
    got = choose(beats, "z@1", 100 * MB)
    assert got is not None and (got.worker, got.evict) == ("b", ())


def test_holders_loaders_and_workers_without_room_are_skipped() -> None:
    beats = [worker("a", [("z@1", 100, 1.0)], 300), worker("b", [], 300, loading=["z@1"]),
             worker("c", [], 50)]
    assert choose(beats, "z@1", 100 * MB) is None
    assert choose([worker("d", [], 0)], "z@1", 10**12) is not None  # 0: no limit
