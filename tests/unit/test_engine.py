"""workers/engine.py with a fake model at the process edge (no torch)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait

import numpy as np
import pytest

from jobs.core.errors import InvalidRequest
from workers.engines.batching import BatchPolicy
from workers.engines.embeddings import EmbeddingEngine
from workers.engines.scheduling import BATCH, FLEX, JOBS, REALTIME

TIMEOUT = 10


class FakeModel:
    """Each output row is [len(tokens), first token, sum(tokens)]; records every call."""

    def __init__(self, gate: threading.Event | None = None, fail_on: int | None = None) -> None:
        self.calls: list[list[list[int]]] = []
        self.gate = gate
        self.fail_on = fail_on  # raise when a batch contains this first token
        self.entered = threading.Event()
        self._lock = threading.Lock()

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        with self._lock:
            self.calls.append([list(t) for t in batch])
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT), "test never released the model"
        if self.fail_on is not None and any(t and t[0] == self.fail_on for t in batch):
            raise RuntimeError("model exploded")
        return np.array([[len(t), t[0] if t else -1, sum(t)] for t in batch], dtype=np.float32)


@pytest.fixture
def engines() -> Iterator[list[EmbeddingEngine]]:
    started: list[EmbeddingEngine] = []
    yield started
    for e in started:
        if e.model.gate is not None:  # type: ignore[attr-defined]
            e.model.gate.set()  # type: ignore[attr-defined]
        e.stop()


def make(engines: list[EmbeddingEngine], model: FakeModel, **policy: object) -> EmbeddingEngine:
    e = EmbeddingEngine(model, BatchPolicy(**policy))  # type: ignore[arg-type]
    engines.append(e)
    return e


def row(i: int, n: int) -> list[int]:
    return [i] + [7] * (n - 1)


def test_every_future_resolves_with_its_row(engines: list[EmbeddingEngine]) -> None:
    model = FakeModel()
    engine = make(engines, model, max_tokens=256, max_rows=8, min_fill=0.5)
    rows = [row(i, 1 + (i * 13) % 40) for i in range(100)]
    futures = engine.submit(rows, BATCH)
    assert len(futures) == len(rows)
    for r, f in zip(rows, futures, strict=True):
        v = f.result(timeout=TIMEOUT)
        assert v.tolist() == [len(r), r[0], sum(r)]
    # every row was computed exactly once, within the policy's limits
    seen = sorted(t[0] for call in model.calls for t in call)
    assert seen == list(range(100))
    assert all(len(c) <= 8 for c in model.calls)
    assert len(model.calls) > 1
    assert engine.pending() == 0
    assert engine.stats.rows == 100
    assert engine.stats.batches == len(model.calls)
    assert engine.stats.real_tokens == sum(len(r) for r in rows)
    assert engine.stats.computed_tokens >= engine.stats.real_tokens
    assert engine.stats.by_priority == {BATCH: 100}


def test_on_batch_callback(engines: list[EmbeddingEngine]) -> None:
    seen: list[tuple[int, int, int, float]] = []
    engine = EmbeddingEngine(FakeModel(), BatchPolicy(min_fill=0.5),
                             on_batch=lambda *a: seen.append(a))
    engines.append(engine)
    wait(engine.submit([[1, 2, 3], [4, 5]], JOBS), timeout=TIMEOUT)
    assert [(r, real, comp) for r, real, comp, _ in seen] == [(2, 5, 6)]
    assert 0 < seen[0][3] < TIMEOUT  # the batch's seconds, measured


def test_realtime_runs_before_earlier_batch_work(engines: list[EmbeddingEngine]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    engine = make(engines, model, max_tokens=8192, max_rows=2, min_fill=0.0)
    first = engine.submit([[1000]], BATCH)  # occupies the model until the gate opens
    assert model.entered.wait(TIMEOUT)
    flex = engine.submit([[3000 + i] for i in range(2)], FLEX)
    batch = engine.submit([[2000 + i] for i in range(4)], BATCH)
    jobs = engine.submit([[1500 + i] for i in range(2)], JOBS)
    realtime = engine.submit([[0], [1]], REALTIME)
    gate.set()
    wait(first + flex + batch + jobs + realtime, timeout=TIMEOUT)
    assert all(f.done() and f.exception() is None for f in first + flex + batch + jobs + realtime)
    order = [sorted(t[0] for t in call) for call in model.calls]
    assert order == [[1000], [0, 1], [1500, 1501], [2000, 2001], [2002, 2003], [3000, 3001]]
    assert engine.stats.by_priority == {REALTIME: 2, JOBS: 2, BATCH: 5, FLEX: 2}


def test_oldest_item_runs_first_within_a_priority(engines: list[EmbeddingEngine]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    # min_fill 1.0: only equal lengths share a batch, so each length is its own batch
    engine = make(engines, model, max_tokens=8192, max_rows=16, min_fill=1.0)
    engine.submit([[999]], BATCH)
    assert model.entered.wait(TIMEOUT)
    long_ = engine.submit([row(1, 30)], BATCH)
    short = engine.submit([row(2, 3), row(3, 3)], BATCH)
    gate.set()
    wait(long_ + short, timeout=TIMEOUT)
    firsts = [[t[0] for t in call] for call in model.calls]
    assert firsts == [[999], [1], [2, 3]]


def test_a_row_that_raises_fails_alone_and_the_engine_keeps_going(
        engines: list[EmbeddingEngine]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate, fail_on=66)
    engine = make(engines, model, max_tokens=8192, max_rows=3, min_fill=0.0)
    engine.submit([[1]], BATCH)
    assert model.entered.wait(TIMEOUT)
    mixed = engine.submit([[66], [67], [68]], REALTIME)  # one micro-batch of 3
    good = engine.submit([[10], [11]], BATCH)
    gate.set()
    wait(mixed + good, timeout=TIMEOUT)
    exc = mixed[0].exception(timeout=0)
    assert isinstance(exc, InvalidRequest) and exc.status == 400 and "exploded" in exc.message
    assert [f.result(timeout=0).tolist()[1] for f in mixed[1:] + good] == [67, 68, 10, 11]
    later = engine.submit([[5, 5]], REALTIME)[0].result(timeout=TIMEOUT)
    assert later.tolist() == [2, 5, 10]


def test_one_poisoned_row_among_32_fails_alone(engines: list[EmbeddingEngine]) -> None:
    """In one micro-batch of 32, the row the model raises for fails with the request's
    error; the 31 others get the vectors they get without it, and the breaker hears of
    no failure (the model works)."""
    rows = [row(i, 5) for i in range(100, 132)]
    rows[13] = row(66, 5)
    passes: list[bool] = []
    alone = make(engines, FakeModel(), max_tokens=8192, max_rows=64, min_fill=0.0)
    want = [f.result(timeout=TIMEOUT).tolist()
            for f in alone.submit(rows[:13] + rows[14:], BATCH)]
    model = FakeModel(fail_on=66)
    engine = EmbeddingEngine(model, BatchPolicy(8192, 64, 0.0), on_pass=passes.append)  # type: ignore[arg-type]
    engines.append(engine)
    futures = engine.submit(rows, BATCH)
    wait(futures, timeout=TIMEOUT)
    bad = futures.pop(13).exception(timeout=0)
    assert isinstance(bad, InvalidRequest) and "this input's embedding could not" in bad.message
    assert [f.result(timeout=0).tolist() for f in futures] == want
    assert len(model.calls[0]) == 32 and False not in passes
    assert engine.stats.faults == 1 and engine.stats.fault_splits == 5


def test_a_model_that_fails_every_pass_fails_every_row_as_the_server_s(
        engines: list[EmbeddingEngine]) -> None:
    """Every row fails with the model's error (a 500), and the breaker hears of the one
    failed micro-batch before any row fails: a caller that sees its row fail then sees
    the breaker open (the shard pipeline hands its shard back, uncommitted)."""
    gate = threading.Event()
    futures: list[Future[np.ndarray]] = []
    passes: list[tuple[bool, bool]] = []

    class Broken(FakeModel):
        def embed(self, batch: list[list[int]]) -> np.ndarray:
            assert gate.wait(TIMEOUT)
            raise RuntimeError("device lost")

    def on_pass(ok: bool) -> None:
        passes.append((ok, any(f.done() for f in futures)))

    engine = EmbeddingEngine(Broken(), BatchPolicy(8192, 64, 0.0), on_pass=on_pass)  # type: ignore[arg-type]
    engines.append(engine)
    futures += engine.submit([[1], [2], [3], [4]], BATCH)
    gate.set()
    wait(futures, timeout=TIMEOUT)
    assert all(type(f.exception(timeout=0)) is RuntimeError for f in futures)
    assert passes == [(False, False)]  # one failed micro-batch, heard before any row failed


def test_wrong_row_count_fails_the_batch(engines: list[EmbeddingEngine]) -> None:
    class Short(FakeModel):
        def embed(self, batch: list[list[int]]) -> np.ndarray:
            return super().embed(batch)[:-1]

    engine = make(engines, Short())
    futures = engine.submit([[1], [2]], BATCH)
    wait(futures, timeout=TIMEOUT)
    assert all(isinstance(f.exception(timeout=0), RuntimeError) for f in futures)


def test_concurrent_submitters_share_a_micro_batch(engines: list[EmbeddingEngine]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    engine = make(engines, model, max_tokens=8192, max_rows=64, min_fill=0.5)
    engine.submit([[1]], BATCH)
    assert model.entered.wait(TIMEOUT)
    results: dict[str, list] = {}
    barrier = threading.Barrier(2)

    def submitter(name: str, base: int) -> None:
        barrier.wait()
        results[name] = engine.submit([[base + i, 1, 1] for i in range(5)], BATCH)

    threads = [threading.Thread(target=submitter, args=("a", 100)),
               threading.Thread(target=submitter, args=("b", 200))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert engine.pending() == 10
    gate.set()
    all_futures = results["a"] + results["b"]
    wait(all_futures, timeout=TIMEOUT)
    assert [len(c) for c in model.calls] == [1, 10]
    assert sorted(t[0] for t in model.calls[1]) == [100, 101, 102, 103, 104,
                                                    200, 201, 202, 203, 204]
    assert [f.result(timeout=0).tolist()[1] for f in results["a"]] == [100, 101, 102, 103, 104]
    assert [f.result(timeout=0).tolist()[1] for f in results["b"]] == [200, 201, 202, 203, 204]


def test_cancelled_future_is_skipped(engines: list[EmbeddingEngine]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    engine = make(engines, model, max_rows=8, min_fill=0.0)
    engine.submit([[1]], BATCH)
    assert model.entered.wait(TIMEOUT)
    futures = engine.submit([[50], [51]], BATCH)
    assert futures[0].cancel()
    gate.set()
    assert futures[1].result(timeout=TIMEOUT).tolist()[1] == 51
    assert [t[0] for t in model.calls[-1]] == [51]


def test_stop_terminates_the_engine_thread() -> None:
    engine = EmbeddingEngine(FakeModel(), BatchPolicy())
    assert engine.submit([[1, 2]], BATCH)[0].result(timeout=TIMEOUT).tolist() == [2, 1, 3]
    t0 = time.monotonic()
    engine.stop()
    assert time.monotonic() - t0 < 5
    assert not engine._thread.is_alive()


def test_stop_while_idle_is_prompt() -> None:
    engine = EmbeddingEngine(FakeModel(), BatchPolicy())
    time.sleep(0.05)  # the loop is now waiting on its condition
    engine.stop()
    assert not engine._thread.is_alive()


def test_free_for_a_priority_while_only_other_work_runs(engines: list[EmbeddingEngine]) -> None:
    gate = threading.Event()
    model = FakeModel(gate)
    engine = make(engines, model, max_tokens=256, max_rows=1, min_fill=0.0)
    assert engine.free_for(REALTIME)
    first = engine.submit([row(1, 3)], REALTIME)
    assert model.entered.wait(TIMEOUT)
    assert not engine.free_for(REALTIME)  # its pass runs
    assert engine.free_for(BATCH)
    waiting = engine.submit([row(2, 3)], BATCH)
    assert not engine.free_for(BATCH)  # a batch row waits
    gate.set()
    first[0].result(timeout=TIMEOUT)
    waiting[0].result(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while not (engine.free_for(REALTIME) and engine.free_for(BATCH)):
        assert time.monotonic() < deadline, "the engine never became free"
        time.sleep(0.01)


def test_rows_gathered_together_run_in_one_pass(engines: list[EmbeddingEngine]) -> None:
    model = FakeModel()
    engine = make(engines, model, max_tokens=256, max_rows=8, min_fill=0.0)
    with engine.gathering():
        futures = [engine.submit([row(i, 3)], REALTIME)[0] for i in range(5)]
        time.sleep(0.2)  # without the hold, the first row would have run alone by now
        assert model.calls == []
    wait(futures, timeout=TIMEOUT)
    assert [sorted(t[0] for t in c) for c in model.calls] == [[0, 1, 2, 3, 4]]


def test_wait_free_returns_when_the_pass_of_that_priority_ends(
        engines: list[EmbeddingEngine]) -> None:
    gate = threading.Event()
    model = FakeModel(gate)
    engine = make(engines, model, max_tokens=256, max_rows=1, min_fill=0.0)
    done = engine.submit([row(1, 3)], REALTIME)
    assert model.entered.wait(TIMEOUT)
    assert not engine.wait_free(REALTIME, 0.1)  # still running
    threading.Timer(0.2, gate.set).start()
    assert engine.wait_free(REALTIME, TIMEOUT)  # woken when the pass ends
    assert done[0].done()
