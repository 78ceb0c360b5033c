"""One row that cannot be computed, among 31 that can, in the same engine step: only
that row fails, with the request's error (400), and the 31 others get exactly the
output they get without it. Driven step by step (the engine's thread stopped) on the
tiny random Llama; the faults are raised by wrappers at the model's edge, for the
poisoned row's input only."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
import torch

from jobs.core.errors import InvalidRequest
from jobs.protocol.endpoints import COMPLETIONS
from workers.engines.generation.engine import GenerationEngine
from workers.engines.request import GenRequest
from workers.engines.sampling import NO_SCORE, sample
from workers.engines.sinks import Collect
from workers.models.chat import ChatModel
from workers.shards.runners import GenerationRunner

ROWS, BAD, NEW = 32, 13, 8
WORDS = ("cat", "dog", "sun", "rain", "tree", "stone", "river", "bird")


def texts() -> list[str]:
    """32 distinct short prompts; the poisoned one (index BAD) ends with "zebra"."""
    out = [f"a {WORDS[i % 8]} and a {WORDS[i // 8]} number {i}" for i in range(ROWS)]
    out[BAD] = "the last word is zebra"
    return out


def requests(tiny: ChatModel, **bad: Any) -> list[GenRequest]:
    reqs = [GenRequest(prompt=tiny.prompt_ids(t), max_new_tokens=NEW, temperature=0)
            for t in texts()]
    reqs[BAD] = GenRequest(**{**reqs[BAD].__dict__, **bad})
    return reqs


def marker(tiny: ChatModel) -> int:
    """A token of the poisoned prompt that no other prompt has."""
    others = {x for i, t in enumerate(texts()) if i != BAD for x in tiny.prompt_ids(t)}
    return next(x for x in tiny.prompt_ids(texts()[BAD]) if x not in others)


def drive(tiny: ChatModel, reqs: list[GenRequest]) -> tuple[list[Collect], GenerationEngine]:
    """Every request admitted in one step, then steps until every one has ended."""
    engine = GenerationEngine(tiny, max_batch_rows=ROWS, max_rows=ROWS)
    engine.stop()
    sinks = [Collect() for _ in reqs]
    for r, s in zip(reqs, sinks, strict=True):
        engine.submit(r, s, 2)
    for _ in range(4 * NEW + 50):
        if all(s.event.is_set() for s in sinks):
            break
        with engine._cond:
            admitted = engine._admit()
        engine.step(admitted)
    assert all(s.event.is_set() for s in sinks), "the engine stopped making progress"
    return sinks, engine


@contextmanager
def wrapped(tiny: ChatModel, name: str, wrapper: Callable[..., Any]) -> Iterator[None]:
    setattr(tiny, name, wrapper(getattr(tiny, name)))
    try:
        yield
    finally:
        delattr(tiny, name)


def baseline(tiny: ChatModel) -> list[str]:
    """The 31 good rows' texts, run without the poisoned one."""
    good = [r for i, r in enumerate(requests(tiny)) if i != BAD]
    sinks, _ = drive(tiny, good)
    assert all(s.error is None for s in sinks)
    return [s.text for s in sinks]


def assert_only_the_bad_row_failed(sinks: list[Collect], good: list[str], match: str) -> None:
    bad = sinks.pop(BAD)
    assert isinstance(bad.error, InvalidRequest) and bad.error.status == 400, bad.error
    assert match in bad.error.message and "could not be computed" in bad.error.message
    assert [s.error for s in sinks] == [None] * (ROWS - 1)
    assert [s.text for s in sinks] == good


def test_a_prefill_that_raises_for_one_row_fails_that_row_alone(tiny: ChatModel) -> None:
    good, mark = baseline(tiny), marker(tiny)

    def poisoned(real):  # type: ignore[no-untyped-def]
        def prefill(ps, pasts=None):  # type: ignore[no-untyped-def]
            if any(mark in p for p in ps):
                raise RuntimeError("cannot compute this prompt")
            return real(ps, pasts)
        return prefill

    with wrapped(tiny, "prefill", poisoned):
        sinks, engine = drive(tiny, requests(tiny))
    assert_only_the_bad_row_failed(sinks, good, "cannot compute this prompt")
    assert engine.stats.faults == 1 and engine.stats.fault_splits == 5  # 32, 16, ..., 2


def test_a_decode_that_raises_for_one_row_fails_that_row_alone(tiny: ChatModel) -> None:
    """The poisoned row's prompt is the longest: the wrapper raises once a decode feeds
    a position no other row reaches, three tokens into the poisoned row's answer."""
    good = baseline(tiny)
    long = tiny.prompt_ids(" ".join(["zebra"] * 30))
    limit = len(long) + 2
    assert all(len(r.prompt) + NEW < limit for i, r in enumerate(requests(tiny)) if i != BAD)

    decoded: list[int] = []

    def poisoned(real):  # type: ignore[no-untyped-def]
        def decode_step(last, positions, kv):  # type: ignore[no-untyped-def]
            if max(positions) >= limit:
                raise RuntimeError("cannot decode this position")
            decoded.append(max(positions))
            return real(last, positions, kv)
        return decode_step

    with wrapped(tiny, "decode_step", poisoned):
        sinks, engine = drive(tiny, requests(tiny, prompt=long))
    assert max(decoded) == limit - 1  # it decoded beside the others until then
    assert_only_the_bad_row_failed(sinks, good, "cannot decode this position")
    assert engine.stats.faults == 1 and engine.stats.fault_splits >= 5


def test_a_row_that_cannot_be_sampled_fails_alone_without_a_second_pass(
        tiny: ChatModel) -> None:
    good, mark = baseline(tiny), marker(tiny)

    def poisoned(real):  # type: ignore[no-untyped-def]
        def prefill(ps, pasts=None):  # type: ignore[no-untyped-def]
            logits, kv = real(ps, pasts)
            logits = logits.clone()  # out of inference mode, to be written
            for i, p in enumerate(ps):
                if mark in p:
                    logits[i] = math.nan
            return logits, kv
        return prefill

    with wrapped(tiny, "prefill", poisoned):
        sinks, engine = drive(tiny, requests(tiny, temperature=0.7, seed=3))
    assert_only_the_bad_row_failed(sinks, good, NO_SCORE)
    assert engine.stats.prefills == 1 and engine.stats.fault_splits == 0


@pytest.mark.parametrize("bad", [{"temperature": 1e-300}, {"temperature": 5e-324},
                                 {"temperature": 1.0, "top_p": 1e-300},
                                 {"temperature": 2.0, "top_p": 5e-324, "seed": 1}])
def test_vanishing_temperature_or_top_p_is_greedy_beside_the_others(
        tiny: ChatModel, bad: dict[str, Any]) -> None:
    """The parameters that used to fail the whole step: the row now samples, as greedy
    decoding does (nothing but the top token is left), and the others are untouched."""
    greedy, _ = drive(tiny, requests(tiny))
    sinks, engine = drive(tiny, requests(tiny, **bad))
    assert [s.error for s in sinks] == [None] * ROWS and engine.stats.faults == 0
    assert [s.text for s in sinks] == [s.text for s in greedy]


def test_a_model_that_fails_every_pass_fails_every_row_as_the_server_s(
        tiny: ChatModel) -> None:
    def broken(_real):  # type: ignore[no-untyped-def]
        def prefill(ps, pasts=None):  # type: ignore[no-untyped-def]
            raise RuntimeError("device lost")
        return prefill

    with wrapped(tiny, "prefill", broken):
        sinks, _ = drive(tiny, requests(tiny)[:4])
    assert [type(s.error) for s in sinks] == [RuntimeError] * 4  # a 500, not the request's
    assert all(str(s.error) == "device lost" for s in sinks)


def test_batch_lines_get_the_request_s_error_and_server_faults_are_noted(
        tiny: ChatModel) -> None:
    """The runner's lines: the poisoned request's is a 400 error line, and the chunk
    notes no server fault; with a model that fails everything, every line is noted."""
    mark = marker(tiny)
    engine = GenerationEngine(tiny, max_batch_rows=ROWS, max_rows=ROWS)
    rows = [{"custom_id": f"r{i}", "body": orjson.dumps(
        {"model": "tiny", "prompt": t, "max_tokens": 4, "temperature": 0}).decode()}
        for i, t in enumerate(texts())]
    runner = GenerationRunner(lambda _: engine, COMPLETIONS)

    def failing(pred: Callable[[list[list[int]]], bool]):  # type: ignore[no-untyped-def]
        def wrap(real):  # type: ignore[no-untyped-def]
            def prefill(ps, pasts=None):  # type: ignore[no-untyped-def]
                if pred(ps):
                    raise RuntimeError("cannot compute this prompt")
                return real(ps, pasts)
            return prefill
        return wrap

    try:
        with engine._cond:  # every row waits when the engine next admits
            chunk = runner.submit(rows, 2)
        with wrapped(tiny, "prefill", failing(lambda ps: any(mark in p for p in ps))):
            ok, err, completed, failed, _ = runner.collect(chunk)
        assert (completed, failed, chunk.faults) == (ROWS - 1, 1, [])
        line = orjson.loads(err)
        assert line["custom_id"] == f"r{BAD}" and line["response"]["status_code"] == 400
        assert len(ok.splitlines()) == ROWS - 1
        with wrapped(tiny, "prefill", failing(lambda ps: True)):
            chunk = runner.submit(rows[:3], 2)
            _, err, completed, failed, _ = runner.collect(chunk)
        assert (completed, failed, len(chunk.faults)) == (0, 3, 3)
        assert {orjson.loads(x)["response"]["status_code"] for x in err.splitlines()} == {500}
    finally:
        engine.stop()


def test_the_engine_serves_on_after_a_poisoned_step(tiny: ChatModel) -> None:
    engine = GenerationEngine(tiny)
    try:
        bad = Collect()
        engine.submit(GenRequest(prompt=tiny.prompt_ids("x"), max_new_tokens=3,
                                 temperature=1e-300), bad, 0)
        assert bad.result(timeout=60).error is None
        again = Collect()
        engine.submit(GenRequest(prompt=tiny.prompt_ids("x"), max_new_tokens=3,
                                 temperature=0), again, 0)
        assert again.result(timeout=60).text == bad.text
    finally:
        engine.stop()


def test_a_row_that_fails_to_sample_leaves_its_neighbours_draws_alone() -> None:
    """Seeded rows sample from their own generators: a neighbour that fails changes
    nothing in theirs (each row's draw consumes only its row's generator)."""
    logits = torch.randn(3, 50)
    reqs = [GenRequest(prompt=[1], max_new_tokens=1, temperature=0.8, seed=s) for s in (1, 2, 3)]
    both = sample(logits, reqs, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    logits[1] = math.nan
    one = sample(logits, reqs, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    assert isinstance(one[1], ValueError) and [one[0], one[2]] == [both[0], both[2]]
