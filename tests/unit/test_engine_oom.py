"""Out of memory inside a micro-batch: the engine splits it and retries the halves;
a single row that cannot fit fails alone, with a clear error, and nothing else does."""

from __future__ import annotations

import numpy as np
import pytest

from workers.engines.batching import BatchPolicy
from workers.engines.embeddings import EmbeddingEngine
from workers.engines.scheduling import BATCH


class Tight:
    """A model (process-edge fake) whose memory holds at most ``limit`` padded tokens."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: list[int] = []

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        width = max(map(len, batch))
        self.calls.append(len(batch))
        if width * len(batch) > self.limit:
            raise MemoryError("out of memory")
        return np.array([[float(len(x))] for x in batch], dtype=np.float32)


def test_oom_splits_then_fails_only_the_row_that_cannot_fit() -> None:
    model = Tight(limit=100)
    engine = EmbeddingEngine(model, BatchPolicy(max_tokens=10_000, max_rows=64, min_fill=0.0))
    try:
        rows = [[1] * 10 for _ in range(16)] + [[1] * 150]  # one row alone is over the limit
        futures = engine.submit(rows, BATCH)
        ok = [f.result(timeout=30) for f in futures[:16]]
        assert [float(v[0]) for v in ok] == [10.0] * 16
        with pytest.raises(MemoryError, match="does not fit"):
            futures[16].result(timeout=30)
        assert engine.stats.oom_splits >= 2 and max(model.calls) > 10  # it tried big first
    finally:
        engine.stop()
