"""Realtime rows shared among projects (workers/engines/scheduling.py): the admission
order (the oldest sequence of the project holding the fewest rows), a project's share
of the rows, and, on the transformers engine with a tiny random Llama, one project's
request of many choices filling every row while another project's request is answered
at once, the rows it gave up resuming with exactly the text they would have had."""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from dataclasses import dataclass, field

import torch

from workers.engines.generation.engine import GenerationEngine
from workers.engines.prefix_cache import WORTH_TOKENS, PrefixCache
from workers.engines.request import GenRequest
from workers.engines.responses import TokenLogprob
from workers.engines.scheduling import ceiling, fair_index, over_share, share, take
from workers.engines.sinks import Collect, FinishReason
from workers.models.chat import ChatModel


@dataclass
class Item:
    """A queued sequence as the scheduling functions read it."""

    priority: int
    order: int
    req: GenRequest = field(default_factory=lambda: GenRequest(prompt=[1], max_new_tokens=1))
    logprob_sum: float = 0.0
    generated: list[int] = field(default_factory=list)


def queue(*entries: tuple[int, str]) -> list[tuple[int, int, Item]]:
    """A waiting heap of (priority, project) entries, in arrival order."""
    heap: list[tuple[int, int, Item]] = []
    for order, (prio, project) in enumerate(entries):
        item = Item(prio, order, GenRequest(prompt=[1], max_new_tokens=1, project=project))
        heapq.heappush(heap, (prio, order, item))
    return heap


def drain(heap: list[tuple[int, int, Item]], held: Counter[str]) -> str:
    """The projects in the order they are admitted (each admission holds a row)."""
    out = ""
    while heap:
        item = take(heap, fair_index(heap, held))
        out += item.req.project or "-"
        held[item.req.project] += item.priority == 0
    return out


def test_realtime_is_admitted_round_robin_by_rows_held() -> None:
    # A's eight choices came first; B's and C's requests after: they are not behind A's.
    heap = queue(*[(0, "A")] * 8, (0, "B"), (0, "C"), (0, "B"))
    assert drain(heap, Counter()) == "ABCABAAAAAA"
    # A project already holding rows waits for those holding fewer.
    heap = queue((0, "A"), (0, "A"), (0, "B"))
    assert drain(heap, Counter({"A": 3})) == "BAA"


def test_batch_work_keeps_its_order_after_realtime() -> None:
    heap = queue((2, "A"), (0, "A"), (0, "B"), (1, "B"), (2, "B"))
    assert drain(heap, Counter({"A": 1})) == "BAB" + "AB"  # realtime fairly, then by priority
    assert drain(queue((2, "A"), (2, "B")), Counter({"A": 9})) == "AB"  # FIFO, not fair


def test_a_project_below_its_share_takes_a_row_from_the_one_furthest_above() -> None:
    assert share(64, Counter({"A": 64}), {"B"}) == 32
    assert share(64, Counter({"A": 60, "B": 4}), {"C"}) == 21
    assert over_share("B", 64, Counter({"A": 64}), set()) == "A"
    assert over_share("B", 64, Counter({"A": 32, "B": 32}), set()) is None  # B holds its share
    assert over_share("C", 64, Counter({"A": 40, "B": 24}), set()) == "A"
    assert over_share("C", 64, Counter({"A": 21, "B": 21, "C": 20}), {"D"}) is None
    assert over_share("A", 4, Counter({"A": 3}), set()) is None  # alone: nobody to yield
    assert ceiling(64) == 56 and ceiling(8) == 7 and ceiling(1) == 1


def greedy(model: ChatModel, prompt: list[int], n: int) -> str:
    ids = torch.tensor([prompt])
    out = model.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=n, do_sample=False, pad_token_id=model.pad_id)
    return model.decode([int(x) for x in out[0, len(prompt):]])


def test_a_flood_of_one_project_yields_a_row_to_another_at_the_next_step(
        tiny: ChatModel) -> None:
    """Project A's eight long sequences fill the four rows (the rest wait); B's short
    request is admitted at the next step by taking one of A's rows, and answered
    while A's run on. Every A sequence, the one that gave up its row included,
    ends with exactly its text alone (greedy)."""
    engine = GenerationEngine(tiny, max_batch_rows=2, max_rows=4)
    a_prompt = tiny.prompt_ids("a very long answer for project a")
    flood = [Collect() for _ in range(8)]
    b_done = threading.Event()
    b = Collect(on_done=lambda _: b_done.set())
    try:
        for s in flood:
            engine.submit(GenRequest(prompt=a_prompt, max_new_tokens=40, temperature=0,
                                     project="A"), s, 0)
        while engine.stats.steps < 3:  # A holds every row
            threading.Event().wait(0.01)
        engine.submit(GenRequest(prompt=tiny.prompt_ids("b asks"), max_new_tokens=3,
                                 temperature=0, project="B"), b, 0)
        assert b_done.wait(60)
        assert b.error is None and b.usage.completion_tokens == 3
        assert sum(s.event.is_set() for s in flood) == 0  # answered while A's run
        for s in flood:
            s.result(timeout=120)
    finally:
        engine.stop()
    assert engine.stats.yielded == 1
    want = greedy(tiny, a_prompt, 40)
    assert all(s.text == want and s.reason == FinishReason.LENGTH for s in flood)
    assert b.text == greedy(tiny, tiny.prompt_ids("b asks"), 3)


def test_one_project_alone_keeps_every_row(tiny: ChatModel) -> None:
    """Without another project waiting nothing is given up: the flood takes all rows."""
    engine = GenerationEngine(tiny, max_batch_rows=2, max_rows=4)
    sinks = [Collect() for _ in range(6)]
    try:
        for s in sinks:
            engine.submit(GenRequest(prompt=tiny.prompt_ids("alone"), max_new_tokens=8,
                                     temperature=0, project="A"), s, 0)
        for s in sinks:
            s.result(timeout=120)
    finally:
        engine.stop()
    assert engine.stats.yielded == 0 and engine.stats.max_rows == 4


class Steps(Collect):
    """A Collect that notes, per choice, the engine step of its first piece."""

    def __init__(self, engine: GenerationEngine) -> None:
        super().__init__()
        self.engine = engine
        self.first: dict[int, int] = {}

    def delta(self, text: str) -> None:
        self.first.setdefault(0, self.engine.stats.steps)
        super().delta(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        self.first.setdefault(index, self.engine.stats.steps)
        super().piece(index, text, tokens)


def test_one_request_of_128_choices_streams_them_all_and_yields_to_another_project(
        tiny: ChatModel) -> None:
    """One project's single request of n=128 sampled choices, on rows as a worker sets
    them (64, the prefill budget of 512 tokens, the prefix cache): its prompt is computed
    once per wave of rows, not once per choice, and every row's first token comes at the
    first step. Run again with another project's short request arriving meanwhile: that
    one has its first token at the next step and is answered while A's run, and each of
    A's choices ends with exactly the text it has alone (seeded: choice i draws from
    seed + i, the one that gave up its row included)."""
    prompt = tiny.prompt_ids("a story about the sea, as long as it can be")

    def flood() -> GenRequest:
        return GenRequest(prompt=prompt, max_new_tokens=8, temperature=1.0, seed=3,
                          n=128, best_of=128, project="A")

    def engine() -> GenerationEngine:
        return GenerationEngine(tiny, max_batch_rows=32, max_rows=64, max_prefill_tokens=512,
                                prefix_cache=PrefixCache(64 << 20, min_hit_tokens=WORTH_TOKENS))

    e = engine()
    try:
        alone = Steps(e)
        e.submit(flood(), alone, 0)
        alone.result(timeout=600)
    finally:
        e.stop()
    assert len(alone.choices) == 128 and alone.usage.completion_tokens == 128 * 8
    assert all(c.reason == "length" and c.text for c in alone.choices)
    assert sorted(alone.first.values())[:64] == [0] * 64  # 64 rows, all in the first step
    assert e.stats.prefill_tokens <= 2 * len(prompt)  # once per wave of 64 rows
    assert len({c.text for c in alone.choices}) > 100  # sampled: the choices differ

    e = engine()
    try:
        shared = Steps(e)
        e.submit(flood(), shared, 0)
        while e.stats.steps < 3:
            threading.Event().wait(0.01)
        b = Steps(e)
        asked = e.stats.steps
        e.submit(GenRequest(prompt=tiny.prompt_ids("b asks"), max_new_tokens=3,
                            temperature=0, project="B"), b, 0)
        b.result(timeout=600)
        assert not shared.event.is_set()  # answered while A's run
        shared.result(timeout=600)
    finally:
        e.stop()
    assert b.first[0] - asked <= 2 and e.stats.yielded >= 1
    assert b.text == greedy(tiny, tiny.prompt_ids("b asks"), 3)
    assert [(c.text, c.reason) for c in shared.choices] == \
        [(c.text, c.reason) for c in alone.choices]
