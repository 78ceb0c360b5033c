"""Shadow requests for chat (jobs.fleet.shadow) on real Redis: the candidate version's
generation is compared by exact match with the text the client got, its failures
are counted, and the report gives agreement and latency per version. The candidate's
worker is played by this test (its stream published by the workers' own PubSink), on
a Redis DB of the test's own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import redis as redis_lib

from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.fleet import heartbeats, shadow
from jobs.protocol.endpoints import CHAT
from jobs.realtime import shadow as mirror

MODEL = "shadowed-chat"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


@pytest.fixture
def ctx(own_settings: Settings) -> Iterator[Context]:
    c = Context(own_settings)
    yield c
    shadow.reset(c.redis, MODEL)
    c.close()


class Candidate(threading.Thread):
    """Version 2's worker: answers each request on its queue with ``texts`` in turn (a
    str: the generated text; None: an error event)."""

    def __init__(self, r: redis_lib.Redis, texts: list[str | None]) -> None:  # type: ignore[type-arg]
        from workers.lanes.streams import CancelListener, Publisher, PubSink

        super().__init__(daemon=True)
        self.r, self.texts = r, list(texts)
        self.publisher, self.cancels = Publisher(r), CancelListener(r)
        self.sink = PubSink
        self.seen: list[dict[str, Any]] = []

    def run(self) -> None:
        self.publisher.start()
        self.cancels.start()
        while self.texts:
            got = self.r.brpop([redis_keys.realtime_queue(f"{MODEL}@2")], timeout=10)
            if got is None:
                return
            msg = orjson.loads(got[1])
            self.seen.append(msg)
            sink = self.sink(self.publisher, msg["id"], self.cancels)
            text = self.texts.pop(0)
            if text is None:
                sink.error(500, {"message": "inference failed", "type": "server_error",
                                 "param": None, "code": None})
                continue
            sink.start()
            for word in text.split(" "):
                sink.delta(word + " ")
            sink.finish("stop", SimpleNamespace(prompt_tokens=3,  # type: ignore[arg-type]
                                                completion_tokens=2, batch_rows=1))

    def stop(self) -> None:
        for t in (self.publisher, self.cancels):
            t.stopping.set()
            t.join(timeout=5)


def test_chat_shadows_are_compared_by_exact_match(ctx: Context) -> None:
    heartbeats.write(ctx.redis, "cand", {"name": "cand", "lanes": ["realtime"],
                                           "models": [MODEL], "resident": [f"{MODEL}@2"]}, 60)
    cand = Candidate(ctx.redis, ["same text", "other text", None])
    cand.start()
    try:
        for _ in range(3):  # the client got "same text " each time
            shadow.record(ctx.redis, MODEL, "1", "primary", 0.05)
            mirror._generation(ctx, CHAT, dict(BODY), "same text ", ("2",))
    finally:
        cand.join(20)
        cand.stop()
    assert len(cand.seen) == 3
    for msg in cand.seen:  # mirrored as sent, billed to nobody, for version 2
        assert msg["body"] == BODY and msg["version"] == "2"
        assert msg["tenant_id"] is None and msg["api_key_id"] is None
    by = {x.version: x.body() for x in shadow.report(ctx.redis, MODEL)}
    assert by["2"]["shadow"] == 3 and by["2"]["errors"] == 1 and by["2"]["compared"] == 2
    assert by["2"]["agreement"] == pytest.approx(0.5)  # one of the two answers matched
    assert by["2"]["latency_p50_s"] is not None and by["2"]["latency_p50_s"] > 0
    assert by["1"]["primary"] == 3 and by["1"]["latency_p99_s"] == pytest.approx(0.05)


def test_embedding_agreement_is_the_mean_cosine() -> None:
    import base64

    import numpy as np

    a = [np.array([1.0, 0.0], dtype=np.float32), np.array([0.0, 1.0], dtype=np.float32)]
    as_b64 = {"data": [{"index": i, "embedding": base64.b64encode(v.astype("<f4").tobytes())
                        .decode()} for i, v in enumerate(a)]}
    rotated = {"data": [{"index": 1, "embedding": [1.0, 1.0]},
                        {"index": 0, "embedding": [1.0, 0.0]}]}
    assert mirror.cosine(mirror.vectors(as_b64), mirror.vectors(rotated)) == pytest.approx(
        (1.0 + 2 ** -0.5) / 2)
    assert mirror.cosine(a, a[:1]) == 0.0  # answers that do not pair up agree in nothing
