"""The fair dispatcher's choice (jobs.batches.fairshare.select_shards): weighted deficit round
robin across projects, earliest deadline first within one, and the round carried from
one call to the next."""

from __future__ import annotations

import pytest

from jobs.batches.fairshare import Candidate, Turn, select_shards

Q = 100  # quantum: rows of a full shard


def shards(tenant: str, n: int, rows: int = Q, deadline: int = 1000, batch: str | None = None,
           start: int = 0) -> list[Candidate]:
    b = batch or f"batch_{tenant}"
    return [Candidate(f"{b}.{i:06d}", tenant, rows, deadline, b, i)
            for i in range(start, start + n)]


def tenants(sel: list[Candidate]) -> str:
    return "".join(c.tenant_id for c in sel)


def run(cands: list[Candidate], calls: int, per_call: int = 1,
        weights: dict[str, int] | None = None) -> str:
    """Dispatch ``calls`` times, ``per_call`` shards each, carrying the round: the
    projects of the shards sent, in order."""
    left, round_, out = list(cands), {}, ""
    for _ in range(calls):
        sel = select_shards(left, round_, weights or {}, Q, per_call)
        sent = {c.shard_id for c in sel.chosen}
        left = [c for c in left if c.shard_id not in sent]
        round_ = sel.round
        out += tenants(sel.chosen)
    return out


def test_equal_weights_alternate_shard_by_shard() -> None:
    cands = shards("A", 10) + shards("B", 3)
    assert tenants(select_shards(cands, {}, {}, Q, 8).chosen) == "ABABABAA"
    # the same order when the shards are handed out one call at a time
    assert run(cands, 8) == "ABABABAA"


def test_weights_share_in_proportion() -> None:
    cands = shards("A", 20) + shards("B", 20)
    order = run(cands, 12, weights={"A": 3, "B": 1})
    assert order == "AAAB" * 3
    assert tenants(select_shards(cands, {}, {"A": 1, "B": 2}, Q, 9).chosen) == "ABBABBABB"


def test_a_newcomer_waits_at_most_one_turn() -> None:
    """B arrives while A holds the round: its first shard goes after A's current turn."""
    a = shards("A", 50)
    first = select_shards(a, {}, {}, Q, 3)
    assert tenants(first.chosen) == "AAA"
    rest = [c for c in a if c not in first.chosen] + shards("B", 2)
    assert tenants(select_shards(rest, first.round, {}, Q, 4).chosen) == "ABAB"
    # with weight 4, A finishes its turn of 4 shards first, at most
    heavy = select_shards(a, {}, {"A": 4}, Q, 1)
    rest = [c for c in a if c not in heavy.chosen] + shards("B", 2)
    assert tenants(select_shards(rest, heavy.round, {"A": 4}, Q, 6).chosen) == "AAABAA"


def test_earliest_deadline_first_within_a_project() -> None:
    late = shards("A", 2, deadline=5000, batch="batch_a1")
    soon = shards("A", 2, deadline=2000, batch="batch_a2")
    b = shards("B", 2, deadline=1)
    sel = select_shards(late + soon + b, {}, {}, Q, 6).chosen
    assert [c.shard_id for c in sel if c.tenant_id == "A"] == [
        "batch_a2.000000", "batch_a2.000001", "batch_a1.000000", "batch_a1.000001"]
    # B's earlier deadline does not buy it more than its share across projects
    assert tenants(sel) == "BABAAA"
    # same deadline: the older batch, then shard order
    same = shards("A", 2, batch="batch_2") + shards("A", 2, batch="batch_1")
    assert [c.shard_id for c in select_shards(same, {}, {}, Q, 4).chosen] == [
        "batch_1.000000", "batch_1.000001", "batch_2.000000", "batch_2.000001"]


def test_cost_is_rows_so_small_shards_go_several_per_turn() -> None:
    a = shards("A", 6)
    b = shards("B", 6, rows=25)  # four of B's shards make one of A's
    assert tenants(select_shards(a + b, {}, {}, Q, 10).chosen) == "ABBBBABBAA"


def test_a_shard_larger_than_the_quantum_waits_for_credit() -> None:
    a = shards("A", 3, rows=250)  # 2.5 quanta
    b = shards("B", 6)
    order = tenants(select_shards(a + b, {}, {}, Q, 9).chosen)
    # A's credit grows by one quantum per turn: its first shard goes on its third turn,
    # and in the long run it gets a quantum's worth of rows per turn, as B does
    assert order == "BBABBABBA"


def test_credit_is_dropped_when_a_project_runs_dry() -> None:
    sel = select_shards(shards("A", 1, rows=10), {}, {}, Q, 5)
    assert tenants(sel.chosen) == "A" and sel.round == {}


def test_a_turn_cut_short_keeps_credit_and_place() -> None:
    cands = shards("A", 5) + shards("B", 5)
    sel = select_shards(cands, {}, {"A": 3}, Q, 2)
    assert tenants(sel.chosen) == "AA"
    assert sel.round["A"] == Turn(Q, 0) and sel.round["B"].position == 1
    left = [c for c in cands if c not in sel.chosen]
    nxt = select_shards(left, sel.round, {"A": 3}, Q, 2)
    assert tenants(nxt.chosen) == "AB"  # A's last shard of its turn, then B's


def test_round_positions_survive_and_empty_calls_change_nothing() -> None:
    round_ = {"A": Turn(0, 1), "B": Turn(0, 0)}
    cands = shards("A", 3) + shards("B", 3)
    assert tenants(select_shards(cands, round_, {}, Q, 2).chosen) == "BA"
    assert select_shards(cands, round_, {}, Q, 0).round == round_
    assert select_shards([], round_, {}, Q, 3).round == {}


def test_nonpositive_weights_count_as_one_and_the_quantum_must_be_positive() -> None:
    cands = shards("A", 4) + shards("B", 4)
    assert tenants(select_shards(cands, {}, {"A": 0, "B": -2}, Q, 4).chosen) == "ABAB"
    with pytest.raises(ValueError, match="quantum"):
        select_shards(cands, {}, {}, 0, 1)
