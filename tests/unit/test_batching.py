"""The batch policy's contract (workers/engines/batching.py), on fixed and seeded random cases."""

from __future__ import annotations

import random

import pytest

from bench.workload import texts
from workers.engines.batching import BatchPolicy, arrival_order, padding_stats


def check_contract(policy: BatchPolicy, lengths: list[int], batches: list[list[int]]) -> None:
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths))), "every index exactly once"
    for b in batches:
        assert b, "no empty batches"
        assert len(b) <= policy.max_rows
        padded = max(lengths[i] for i in b) * len(b)
        if len(b) > 1:
            assert padded <= policy.max_tokens, (b, padded)
            real = sum(lengths[i] for i in b)
            assert real >= policy.min_fill * padded - 1e-9, (b, real, padded)


def long_tail(rng: random.Random, n: int) -> list[int]:
    return [max(1, min(4000, int(rng.paretovariate(1.2) * rng.choice([1, 3, 8]))))
            for _ in range(n)]


def test_empty_input() -> None:
    assert BatchPolicy().plan([]) == []


def test_single_row_over_budget_runs_alone() -> None:
    policy = BatchPolicy(max_tokens=100, max_rows=8, min_fill=0.5)
    lengths = [10, 500, 10, 10]
    batches = policy.plan(lengths)
    check_contract(policy, lengths, batches)
    assert [1] in batches


def test_equal_lengths_fill_to_row_cap() -> None:
    policy = BatchPolicy(max_tokens=10_000, max_rows=4, min_fill=0.9)
    lengths = [7] * 10
    batches = policy.plan(lengths)
    check_contract(policy, lengths, batches)
    assert [len(b) for b in batches] == [4, 4, 2]


def test_token_budget_caps_rows() -> None:
    policy = BatchPolicy(max_tokens=100, max_rows=128, min_fill=0.0)
    lengths = [10] * 25
    batches = policy.plan(lengths)
    check_contract(policy, lengths, batches)
    assert [len(b) for b in batches] == [10, 10, 5]


def test_min_fill_separates_short_from_long() -> None:
    policy = BatchPolicy(max_tokens=10_000, max_rows=64, min_fill=0.9)
    lengths = [5, 100, 5, 100, 5]
    batches = policy.plan(lengths)
    check_contract(policy, lengths, batches)
    assert sorted(map(sorted, batches)) == [[0, 2, 4], [1, 3]]


def test_batches_run_shortest_first() -> None:
    lengths = [50, 3, 20, 3, 50, 20]
    batches = BatchPolicy(max_tokens=10_000, max_rows=2, min_fill=0.9).plan(lengths)
    maxima = [max(lengths[i] for i in b) for b in batches]
    assert maxima == sorted(maxima)


@pytest.mark.parametrize("seed", range(60))
def test_plan_contract_random(seed: int) -> None:
    rng = random.Random(seed)
    policy = BatchPolicy(max_tokens=rng.choice([64, 512, 2048, 8192]),
                         max_rows=rng.choice([1, 2, 7, 32, 128]),
                         min_fill=rng.choice([0.0, 0.5, 0.8, 0.9, 0.99, 1.0]))
    n = rng.choice([1, 2, 5, 50, 400])
    kind = seed % 3
    if kind == 0:
        lengths = [rng.randint(1, 300) for _ in range(n)]
    elif kind == 1:
        lengths = long_tail(rng, n)
    else:
        lengths = [rng.choice([1, 2, 64, 65, 1000]) for _ in range(n)]
    batches = policy.plan(lengths)
    check_contract(policy, lengths, batches)
    if policy.min_fill == 1.0 and policy.max_rows > 1:
        for b in batches:
            assert len({lengths[i] for i in b}) == 1


def test_arrival_order() -> None:
    assert arrival_order([1] * 5, 2) == [[0, 1], [2, 3], [4]]
    assert arrival_order([1] * 4, 4) == [[0, 1, 2, 3]]
    assert arrival_order([], 3) == []
    assert arrival_order([1, 2, 3], 64) == [[0, 1, 2]]


def test_padding_stats() -> None:
    lengths = [1, 4, 2, 4]
    assert padding_stats(lengths, [[0, 1], [2, 3]]) == (11, 16)
    assert padding_stats(lengths, [[0], [1], [2], [3]]) == (11, 11)
    assert padding_stats(lengths, [[0, 1, 2, 3]]) == (11, 16)
    assert padding_stats([3, 1], [[1, 0]]) == (4, 6)


def test_long_tailed_workload_policy_beats_arrival_order() -> None:
    lengths = [len(text.split()) for _, text in texts(2000, seed=1)]
    assert max(lengths) > 10 * min(lengths)  # the mix really is long-tailed
    policy = BatchPolicy()
    batches = policy.plan(lengths)
    check_contract(policy, lengths, batches)
    real, computed = padding_stats(lengths, batches)
    assert real == sum(lengths)
    assert real / computed >= 0.9
    a_real, a_computed = padding_stats(lengths, arrival_order(lengths, 64))
    assert a_real == real
    assert a_real / a_computed < 0.5
    assert a_computed > 2 * computed
