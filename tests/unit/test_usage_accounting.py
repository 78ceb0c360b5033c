"""Accelerator-seconds and cost: a step's time is split among its rows by their tokens
and the shares add up to the step; cost is seconds times the model's and tier's price;
the usage query's bucket arithmetic and parameter checks (no database here)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from jobs.core.errors import InvalidRequest
from jobs.core.settings import Settings
from jobs.tenants import usage
from workers.engines.batching import BatchPolicy
from workers.engines.embeddings import EmbeddingEngine, seconds_of
from workers.engines.generation.engine import GenerationEngine
from workers.engines.request import GenRequest
from workers.engines.scheduling import BATCH
from workers.engines.sinks import Collect
from workers.models.chat import ChatModel


def test_a_split_sums_to_the_step_and_follows_token_shares() -> None:
    shares = usage.split(0.9, [1, 2, 6])
    assert sum(shares) == pytest.approx(0.9, abs=1e-15)
    assert shares == pytest.approx([0.1, 0.2, 0.6])
    assert usage.split(0.3, [0, 0, 0]) == pytest.approx([0.1, 0.1, 0.1])
    assert usage.split(1.0, []) == []


class SlowModel:
    """Takes a while per forward pass, at the process edge (no torch)."""

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        time.sleep(0.02)
        return np.zeros((len(batch), 3), dtype=np.float32)


def test_embedding_rows_share_their_pass_by_real_tokens() -> None:
    engine = EmbeddingEngine(SlowModel(), BatchPolicy(10_000, 64, min_fill=0.0))
    try:
        rows = engine.submit([[1] * n for n in (2, 4, 4, 6)], BATCH)  # queued together
        more = engine.submit([[1] * 3], BATCH)
        for f in rows + more:
            f.result(timeout=10)
    finally:
        engine.stop()
    secs = [f.seconds for f in rows]
    assert all(s > 0 for s in secs) and more[0].seconds > 0
    # Together they are the engine's busy time: no pass is charged twice or forgotten.
    assert sum(secs) + seconds_of(more) == pytest.approx(engine.stats.busy_s, rel=1e-9)
    assert [s / secs[0] for s in secs] == pytest.approx([1, 2, 2, 3])  # by real tokens


def test_generation_steps_are_split_among_their_sequences(tiny: ChatModel) -> None:
    steps: list[float] = []
    engine = GenerationEngine(tiny, max_batch_rows=4, max_rows=4,
                              on_step=lambda rows, dt: steps.append(dt))
    prompts = ["a cat", "the stock market fell sharply today after the report", "x y"]
    sinks = [Collect() for _ in prompts]
    try:
        for p, n, s in zip(prompts, (4, 9, 6), sinks, strict=True):
            engine.submit(GenRequest(prompt=tiny.prompt_ids(p), max_new_tokens=n,
                                     temperature=0), s, BATCH)
        for s in sinks:
            s.result(timeout=120)
    finally:
        engine.stop()
    charged = [s.usage.accelerator_s for s in sinks]
    assert all(c > 0 for c in charged)
    # Every step's time went to the sequences it computed, and nowhere else.
    assert sum(charged) == pytest.approx(sum(steps), rel=1e-9)
    assert sum(steps) == pytest.approx(engine.stats.step_s, rel=1e-9)


class LeavingSink(Collect):
    """A caller that goes away after ``after`` deltas; the engine bills what it used."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.billed = after, threading.Event()
        self.usage_at_exit: Any = None

    def delta(self, text: str) -> None:
        super().delta(text)
        if len(self.parts) >= self.after:
            self.cancel()

    def abandoned(self, usage: Any) -> None:
        self.usage_at_exit = usage
        self.billed.set()


def test_a_stream_whose_caller_left_is_billed_for_what_it_used(tiny: ChatModel) -> None:
    engine = GenerationEngine(tiny, max_batch_rows=4, max_rows=4)
    sink = LeavingSink(after=3)
    try:
        engine.submit(GenRequest(prompt=tiny.prompt_ids("count to twenty"), max_new_tokens=40,
                                 temperature=0), sink, BATCH)
        assert sink.billed.wait(60)
    finally:
        engine.stop()
    u = sink.usage_at_exit
    assert not sink.event.is_set()  # it never finished: it was dropped
    assert 3 <= u.completion_tokens < 40 and u.accelerator_s > 0


def test_cost_is_seconds_times_the_price_of_the_model_and_tier() -> None:
    st = Settings(usage_price_per_accelerator_hour=3.6, usage_model_prices={"big": 36.0},
                  usage_flex_multiplier=0.5)
    assert usage.cost(st, "small", "default", 10.0) == pytest.approx(0.01)
    assert usage.cost(st, "big", "default", 10.0) == pytest.approx(0.1)
    assert usage.cost(st, "big", "flex", 10.0) == pytest.approx(0.05)
    e = usage.entry(st, source="job:x", tenant_id="p", api_key_id=None, kind="completions",
                    model="big", lane="flex", service_tier="flex", accelerator_seconds=36.0)
    assert e.cost == pytest.approx(0.18)
    with pytest.raises(ValueError):
        Settings(usage_flex_multiplier=1.5)


def q(what: str = "completions", **params: Any) -> usage.Query:
    now = params.pop("now", 1_000_000)
    return usage.parse_query(what, {k: v if isinstance(v, list) else [v]
                                    for k, v in params.items()}, now=now)


def test_buckets_are_aligned_and_pages_follow_the_cursor() -> None:
    day = 86400
    query = q(start_time=str(3 * day + 500), end_time=str(13 * day))
    assert (query.width, query.limit, query.page_start) == (day, 7, 3 * day)
    nxt = q(start_time=str(3 * day + 500), end_time=str(13 * day), page=f"page_{10 * day}")
    assert nxt.page_start == 10 * day
    hourly = q(start_time="7200", bucket_width="1h", now=7200 + 4000)
    assert (hourly.limit, hourly.end_time) == (24, 4 * 3600)  # the bucket in progress ends it
    assert q(start_time="0", bucket_width="1m", limit="1440").limit == 1440
    assert q("embeddings", start_time="0", **{"group_by": ["project_id,model"]}).group_by == (
        "project_id", "model")


@pytest.mark.parametrize("what,params,param", [
    ("completions", {}, "start_time"),
    ("completions", {"start_time": "-5"}, "start_time"),
    ("completions", {"start_time": "1.5"}, "start_time"),
    ("completions", {"start_time": "9" * 40}, "start_time"),
    ("completions", {"start_time": "10", "end_time": "10"}, "end_time"),
    ("completions", {"start_time": "0", "bucket_width": "2d"}, "bucket_width"),
    ("completions", {"start_time": "0", "limit": "32"}, "limit"),
    ("completions", {"start_time": "0", "limit": "0"}, "limit"),
    ("completions", {"start_time": "0", "bucket_width": "1h", "limit": "169"}, "limit"),
    ("completions", {"start_time": "0", "group_by": "user_id"}, "group_by"),
    ("completions", {"start_time": "0", "user_ids": "user_1"}, "user_ids"),
    ("completions", {"start_time": "0", "batch": "yes"}, "batch"),
    ("completions", {"start_time": "0", "page": "page_17"}, "page"),
    ("completions", {"start_time": "0", "page": "junk"}, "page"),
    ("completions", {"start_time": "0", "project_ids": "p\x00"}, "project_ids"),
    ("embeddings", {"start_time": "0", "group_by": "batch"}, "group_by"),
    ("costs", {"start_time": "0", "bucket_width": "1h"}, "bucket_width"),
    ("costs", {"start_time": "0", "limit": "181"}, "limit"),
    ("costs", {"start_time": "0", "group_by": "model"}, "group_by"),
])
def test_bad_parameters_are_refused_with_their_name(what: str, params: dict[str, str],
                                                   param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        q(what, **params)
    assert e.value.status == 400 and e.value.param == param
