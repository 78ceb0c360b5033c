"""The generation engine's cache surgery and scheduling, on a tiny random Llama built
from a config and loaded through the same loader as the real model: sequences that
join and leave a running batch must produce exactly what they produce alone."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from workers.engines.generation.engine import GenerationEngine
from workers.engines.prefix_cache import PrefixCache
from workers.engines.request import GenRequest
from workers.engines.sampling import holdback, stop_at
from workers.engines.sinks import Collect, FinishReason
from workers.models.chat import ChatModel


def alone(model: ChatModel, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=n, do_sample=False, pad_token_id=model.pad_id)
    return [int(x) for x in out[0, len(prompt):]]


def run(engine: GenerationEngine, reqs: list[GenRequest], prio: int = 2) -> list[Collect]:
    sinks = [Collect() for _ in reqs]
    for r, s in zip(reqs, sinks, strict=True):
        engine.submit(r, s, prio)
    for s in sinks:
        s.result(timeout=120)
    return sinks


def test_joining_and_leaving_sequences_match_solo_generation(tiny: ChatModel) -> None:
    prompts = [tiny.prompt_ids(t) for t in (
        "a cat", "the stock market fell sharply today after the report",
        "one two three four five six seven eight nine ten eleven", "hello",
        "a kitten rests on a rug in the warm afternoon sun", "x y")]
    lengths = [3, 9, 5, 12, 7, 10]  # different budgets: rows leave at different steps
    reqs = [GenRequest(prompt=p, max_new_tokens=n, temperature=0)
            for p, n in zip(prompts, lengths, strict=True)]
    engine = GenerationEngine(tiny, max_batch_rows=3, max_rows=3)  # later rows must join
    try:
        sinks = run(engine, reqs)
    finally:
        engine.stop()
    for p, n, s in zip(prompts, lengths, sinks, strict=True):
        assert s.usage.completion_tokens == n and s.reason == FinishReason.LENGTH
        assert s.text == tiny.decode(alone(tiny, p, n))
    assert engine.stats.prefills > 1 and engine.stats.max_rows == 3
    # Later rows took over finished rows of the cache in place, and the tail compacted.
    assert engine.stats.refills >= 2 and engine.stats.compactions >= 1


def test_realtime_joins_a_full_batch_at_the_next_step(tiny: ChatModel) -> None:
    engine = GenerationEngine(tiny, max_batch_rows=2, max_rows=4)
    try:
        gate = threading.Event()
        slow = [Collect() for _ in range(2)]
        for s in slow:
            engine.submit(GenRequest(prompt=tiny.prompt_ids("long batch work"),
                                     max_new_tokens=60, temperature=0), s, 2)
        queued = Collect()  # a third batch row must wait: the batch cap is 2
        engine.submit(GenRequest(prompt=tiny.prompt_ids("waits"), max_new_tokens=2,
                                 temperature=0), queued, 2)
        rt = Collect(on_done=lambda _: gate.set())
        engine.submit(GenRequest(prompt=tiny.prompt_ids("urgent"), max_new_tokens=3,
                                 temperature=0), rt, 0)
        assert gate.wait(60)
        assert rt.usage.batch_rows == 3  # decoded together with the two batch rows
        assert not any(s.event.is_set() for s in slow) and not queued.event.is_set()
        for s in [*slow, queued]:
            s.result(timeout=120)
    finally:
        engine.stop()


def test_cancelled_sequences_leave_at_the_next_step(tiny: ChatModel) -> None:
    engine = GenerationEngine(tiny, max_batch_rows=4, max_rows=4)
    try:
        stay, leave = Collect(), Collect()
        engine.submit(GenRequest(prompt=tiny.prompt_ids("stay"), max_new_tokens=40,
                                 temperature=0), stay, 2)
        engine.submit(GenRequest(prompt=tiny.prompt_ids("leave"), max_new_tokens=40,
                                 temperature=0), leave, 2)
        leave.cancel()
        stay.result(timeout=120)
        assert not leave.event.is_set() and stay.usage.completion_tokens == 40
    finally:
        engine.stop()


def test_seeded_sampling_repeats_and_stop_strings_cut(tiny: ChatModel) -> None:
    engine = GenerationEngine(tiny)
    try:
        req = GenRequest(prompt=tiny.prompt_ids("seeded"), max_new_tokens=12,
                         temperature=1.0, top_p=0.9, seed=7)
        a, b = run(engine, [req, GenRequest(**{**req.__dict__})])
        assert a.text == b.text
        full = run(engine, [GenRequest(prompt=tiny.prompt_ids("stops"), max_new_tokens=20,
                                       temperature=0)])[0].text
        word = full.split()[3] if len(full.split()) > 3 else full.split()[-1]
        cut = run(engine, [GenRequest(prompt=tiny.prompt_ids("stops"), max_new_tokens=20,
                                      temperature=0, stop=[word])])[0]
        assert cut.reason == FinishReason.STOP and word not in cut.text
        assert full.startswith(cut.text)
    finally:
        engine.stop()


def test_stop_helpers() -> None:
    assert stop_at("hello world", ["wor", "xyz"]) == 6
    assert stop_at("hello", ["x"]) is None
    assert holdback("hello wo", ["world"]) == 2  # might become "world": hold "wo"
    assert holdback("hello", ["world"]) == 0
    assert holdback("caf\ufffd", []) == 1  # a torn UTF-8 character waits for the rest


@pytest.fixture
def oom_above(tiny: ChatModel):  # type: ignore[no-untyped-def]
    """Inject out-of-memory into the tiny model above ``rows x width`` tokens."""

    def set_limit(tokens: int) -> None:
        tiny.fault_oom_above_tokens = tokens

    yield set_limit
    tiny.fault_oom_above_tokens = 0


def test_decode_out_of_memory_preempts_and_resumes_exactly(tiny: ChatModel, oom_above) -> None:  # type: ignore[no-untyped-def]
    prompts = [tiny.prompt_ids(t) for t in (
        "a cat", "the stock market fell sharply", "one two three four", "hello",
        "a kitten rests on a rug", "x y")]
    reqs = [GenRequest(prompt=p, max_new_tokens=16, temperature=0) for p in prompts]
    width = max(len(p) for p in prompts)
    oom_above(len(prompts) * (width + 6))  # the whole batch fits for a few steps only
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8)
    try:
        sinks = run(engine, reqs)
    finally:
        engine.stop()
    assert engine.stats.preemptions > 0 and engine.stats.oom_failures == 0
    for p, s in zip(prompts, sinks, strict=True):  # resumed sequences lost and repeated nothing
        assert s.error is None and s.usage.completion_tokens == 16
        assert s.text == tiny.decode(alone(tiny, p, 16))


def test_prefill_out_of_memory_splits_and_too_long_fails_alone(tiny: ChatModel, oom_above) -> None:  # type: ignore[no-untyped-def]
    short = [tiny.prompt_ids(t) for t in ("a cat", "hello there", "x y", "one two")]
    long = tiny.prompt_ids(" ".join(["word"] * 60))
    oom_above(len(long) - 1)  # the long prompt does not fit even alone; each short one does
    reqs = [GenRequest(prompt=p, max_new_tokens=4, temperature=0) for p in short]
    reqs.insert(2, GenRequest(prompt=long, max_new_tokens=4, temperature=0))
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8)
    try:
        sinks = [Collect() for _ in reqs]
        for r, s in zip(reqs, sinks, strict=True):
            engine.submit(r, s, 2)
        for s in sinks:
            assert s.event.wait(120)
    finally:
        engine.stop()
    failed = sinks.pop(2)
    assert isinstance(failed.error, MemoryError) and "does not fit" in str(failed.error)
    assert engine.stats.oom_splits > 0 and engine.stats.oom_failures == 1
    for p, s in zip(short, sinks, strict=True):
        assert s.error is None and s.text == tiny.decode(alone(tiny, p, 4))


# Shared prefixes and chunked prefill: the state they skip computing must be the state
# that computing it gives, so every output equals the sequence's output alone.
INSTRUCTION = " ".join(f"rule {i}: answer briefly and kindly." for i in range(6))
QUESTIONS = ("a cat", "the stock market fell sharply today", "one two three four",
             "hello", "a kitten rests on a rug in the sun", "x y", "why is the sky blue",
             "tell me a story about a dragon and a knight")


def shared(tiny: ChatModel) -> list[list[int]]:
    return [tiny.prompt_ids(f"{INSTRUCTION} {q}") for q in QUESTIONS]


def test_shared_prefixes_are_reused_and_change_nothing(tiny: ChatModel) -> None:
    prompts = shared(tiny)
    lengths = [3, 9, 5, 12, 7, 10, 4, 8]
    reqs = [GenRequest(prompt=p, max_new_tokens=n, temperature=0)
            for p, n in zip(prompts, lengths, strict=True)]
    cache = PrefixCache(8 << 20)
    engine = GenerationEngine(tiny, max_batch_rows=2, max_rows=2, prefix_cache=cache)
    try:
        sinks = run(engine, reqs)
        again = run(engine, reqs[:1])[0]  # the whole prompt but its last token is cached
    finally:
        engine.stop()
    for p, n, s in zip(prompts, lengths, sinks, strict=True):
        assert s.error is None and s.text == tiny.decode(alone(tiny, p, n))
    assert again.text == sinks[0].text
    common = len(os.path.commonprefix(prompts)) // cache.block * cache.block
    # the first two prefill together (two rows: a pass of its own for the second
    # would save too little); the six that join later and the repeat each take at
    # least the shared blocks from the cache
    assert common >= 32 and engine.stats.cached_tokens >= 7 * common
    assert cache.stats.hit_tokens == engine.stats.cached_tokens
    assert engine.stats.prefill_tokens + engine.stats.cached_tokens == \
        sum(len(p) for p in prompts) + len(prompts[0])


def test_rows_admitted_together_compute_their_shared_prefix_once(tiny: ChatModel) -> None:
    prompts = shared(tiny)
    reqs = [GenRequest(prompt=p, max_new_tokens=6, temperature=0) for p in prompts]
    groups: list[int] = []
    before = tiny.prefill

    def counted(ps, pasts=None):  # type: ignore[no-untyped-def]
        groups.append(len(ps))
        return before(ps, pasts)

    cache = PrefixCache(8 << 20)
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8, prefix_cache=cache)
    tiny.prefill = counted  # type: ignore[method-assign]
    try:
        with engine._cond:  # all eight are waiting when the engine first admits
            sinks = [Collect() for _ in reqs]
            for r, sk in zip(reqs, sinks, strict=True):
                engine.submit(r, sk, 2)
        for sk in sinks:
            sk.result(timeout=60)
        # Rows that share little are prefilled together, as one pass.
        few = [tiny.prompt_ids(t) for t in ("a cat sat", "stocks fell", "rain again")]
        alone_too = run(engine, [GenRequest(prompt=p, max_new_tokens=6, temperature=0)
                                 for p in few])
    finally:
        engine.stop()
        del tiny.prefill
    common = len(os.path.commonprefix(prompts)) // cache.block * cache.block
    assert groups == [1, 7, 3]  # the leader alone, then the seven that share its prefix
    assert engine.stats.cached_tokens >= 7 * common
    for p, sk in zip(prompts + few, sinks + alone_too, strict=True):
        assert sk.error is None and sk.text == tiny.decode(alone(tiny, p, 6))


def test_chunked_prefill_keeps_each_step_within_its_budget_and_changes_nothing(
        tiny: ChatModel) -> None:
    prompts = shared(tiny)
    budget = 10
    reqs = [GenRequest(prompt=p, max_new_tokens=6, temperature=0) for p in prompts]
    steps: list[int] = []
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8, max_prefill_tokens=budget)
    before = tiny.prefill

    def counted(ps, pasts=None):  # type: ignore[no-untyped-def]
        steps.append(sum(len(p) - (0 if q is None else q.length)
                         for p, q in zip(ps, pasts or [None] * len(ps), strict=True)))
        return before(ps, pasts)

    tiny.prefill = counted  # type: ignore[method-assign]
    try:
        sinks = run(engine, reqs)
    finally:
        engine.stop()
        del tiny.prefill
    for p, s in zip(prompts, sinks, strict=True):
        assert s.error is None and s.text == tiny.decode(alone(tiny, p, 6))
    assert engine.stats.chunks >= sum(len(p) for p in prompts) // budget - len(prompts)
    assert steps and max(steps) <= budget
    assert engine.stats.prefill_tokens == sum(len(p) for p in prompts)


def test_reuse_and_chunks_survive_preemption_and_prefill_splits(
        tiny: ChatModel, oom_above) -> None:  # type: ignore[no-untyped-def]
    prompts = shared(tiny)
    width = max(len(p) for p in prompts)
    oom_above(3 * (width + 8))  # a few rows fit for a few steps: decodes shed, prefills split
    reqs = [GenRequest(prompt=p, max_new_tokens=16, temperature=0) for p in prompts]
    cache = PrefixCache(8 << 20)
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8, max_prefill_tokens=48,
                              prefix_cache=cache)
    try:
        sinks = run(engine, reqs)
    finally:
        engine.stop()
    assert engine.stats.preemptions > 0 and engine.stats.oom_splits > 0
    assert engine.stats.oom_failures == 0
    assert engine.stats.chunks > 0 and cache.stats.hit_tokens > 0
    for p, s in zip(prompts, sinks, strict=True):
        assert s.error is None and s.usage.completion_tokens == 16
        assert s.text == tiny.decode(alone(tiny, p, 16))


def test_a_step_that_prefills_realtime_rows_prefills_nothing_else(tiny: ChatModel) -> None:
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8)
    groups: list[int] = []
    before = tiny.prefill

    def counted(ps, pasts=None):  # type: ignore[no-untyped-def]
        groups.append(len(ps))
        return before(ps, pasts)

    tiny.prefill = counted  # type: ignore[method-assign]
    try:
        batch = [Collect() for _ in range(4)]
        rt = Collect()
        with engine._cond:  # all five are waiting when the engine next admits
            for s in batch:
                engine.submit(GenRequest(prompt=tiny.prompt_ids("batch work"),
                                         max_new_tokens=4, temperature=0), s, 2)
            engine.submit(GenRequest(prompt=tiny.prompt_ids("urgent"), max_new_tokens=4,
                                     temperature=0), rt, 0)
        for s in [rt, *batch]:
            s.result(timeout=60)
    finally:
        engine.stop()
        del tiny.prefill
    assert groups[:2] == [1, 4]  # the realtime row alone, then the batch rows join
    assert rt.text == tiny.decode(alone(tiny, tiny.prompt_ids("urgent"), 4))


def step_once(engine: GenerationEngine) -> None:
    """One engine step, driven from the test (the engine's thread stopped)."""
    with engine._cond:
        admitted = engine._admit()
    engine.step(admitted)


def test_realtime_prefills_alone_but_never_stall_the_decodes(tiny: ChatModel) -> None:
    """Driven step by step (the engine's thread stopped): a step that prefills a
    realtime row does not decode the running rows, but the next one always does, so
    realtime arrivals at every step delay the others by one step at most."""
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8)
    engine.stop()
    events: list[tuple[str, int]] = []
    prefill, decode = tiny.prefill, tiny.decode_step

    def counted_prefill(ps, pasts=None):  # type: ignore[no-untyped-def]
        events.append(("prefill", len(ps)))
        return prefill(ps, pasts)

    def counted_decode(last, pos, kv):  # type: ignore[no-untyped-def]
        events.append(("decode", len(last)))
        return decode(last, pos, kv)

    def step() -> list[tuple[str, int]]:
        events.clear()
        step_once(engine)
        return list(events)

    def request(text: str) -> GenRequest:
        return GenRequest(prompt=tiny.prompt_ids(text), max_new_tokens=8, temperature=0)

    tiny.prefill, tiny.decode_step = counted_prefill, counted_decode  # type: ignore[method-assign]
    try:
        sinks = [Collect() for _ in range(5)]
        engine.submit(request("batch one"), sinks[0], 2)
        engine.submit(request("batch two"), sinks[1], 2)
        assert step() == [("prefill", 2)]
        engine.submit(request("urgent one"), sinks[2], 0)
        assert step() == [("prefill", 1)]  # the batch rows wait one step
        engine.submit(request("urgent two"), sinks[3], 0)
        assert step() == [("prefill", 1), ("decode", 3)]  # not twice in a row
        engine.submit(request("urgent three"), sinks[4], 0)
        assert step() == [("prefill", 1)]
        while not all(s.event.is_set() for s in sinks):
            step()
    finally:
        del tiny.prefill, tiny.decode_step
    texts = ["batch one", "batch two", "urgent one", "urgent two", "urgent three"]
    for t, s in zip(texts, sinks, strict=True):
        assert s.error is None and s.text == tiny.decode(alone(tiny, tiny.prompt_ids(t), 8))


def test_the_small_prefill_budget_holds_while_realtime_streams_are_about(
        tiny: ChatModel) -> None:
    """Driven step by step on a fake clock: without realtime rows a step may compute
    the batch budget; a realtime submission brings the small one for the quiet time."""
    now = [1000.0]
    engine = GenerationEngine(tiny, max_batch_rows=8, max_rows=8, max_prefill_tokens=12,
                              batch_prefill_tokens=400, realtime_quiet_s=30,
                              clock=lambda: now[0])
    engine.stop()
    computed: list[int] = []
    prefill = tiny.prefill

    def counted(ps, pasts=None):  # type: ignore[no-untyped-def]
        computed.append(sum(len(p) - (0 if q is None else q.length)
                            for p, q in zip(ps, pasts or [None] * len(ps), strict=True)))
        return prefill(ps, pasts)

    def step() -> int:
        computed.clear()
        step_once(engine)
        return sum(computed)

    def request(text: str) -> GenRequest:
        return GenRequest(prompt=tiny.prompt_ids(text), max_new_tokens=4, temperature=0)

    texts = [f"the {n} batch row of this test and its many words" for n in
             ("first", "second", "third")] + ["urgent"] + [
             f"the {n} batch row of this test and its many words" for n in
             ("fourth", "fifth", "sixth", "seventh")]
    sinks = [Collect() for _ in texts]
    tiny.prefill = counted  # type: ignore[method-assign]
    try:
        assert engine.prefill_budget() == 400
        for t, s in zip(texts[:3], sinks[:3], strict=True):
            engine.submit(request(t), s, 2)
        assert step() == sum(len(tiny.prompt_ids(t)) for t in texts[:3]) > 12
        engine.submit(request(texts[3]), sinks[3], 0)
        assert engine.prefill_budget() == 12
        step()  # the realtime row, alone
        now[0] += 29
        for t, s in zip(texts[4:6], sinks[4:6], strict=True):
            engine.submit(request(t), s, 2)
        assert 0 < step() <= 12  # within the quiet time: the small budget, in chunks
        now[0] += 2
        assert engine.prefill_budget() == 400
        for t, s in zip(texts[6:], sinks[6:], strict=True):
            engine.submit(request(t), s, 2)
        assert step() > 12  # the quiet time is over
        while not all(s.event.is_set() for s in sinks):
            step()
    finally:
        del tiny.prefill
    for t, s in zip(texts, sinks, strict=True):
        assert s.error is None and s.text == tiny.decode(alone(tiny, tiny.prompt_ids(t), 4))
