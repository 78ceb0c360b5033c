"""Prometheus metrics of the worker process."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

BATCH_ROWS = Histogram("inferq_engine_batch_rows", "Rows per engine micro-batch",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
BATCH_SECONDS = Histogram("inferq_engine_batch_seconds", "Model time per micro-batch")
REAL_TOKENS = Counter("inferq_engine_real_tokens", "Tokens that carried input")
COMPUTED_TOKENS = Counter("inferq_engine_computed_tokens", "Tokens computed (incl. padding)")


def record_batch(rows: int, real: int, computed: int, seconds: float) -> None:
    BATCH_ROWS.observe(rows)
    BATCH_SECONDS.observe(seconds)
    REAL_TOKENS.inc(real)
    COMPUTED_TOKENS.inc(computed)

GEN_STEP_ROWS = Histogram("inferq_generation_step_rows", "Sequences per decode step",
                          buckets=(1, 2, 4, 8, 16, 32, 64, 128))
GEN_STEP_SECONDS = Histogram("inferq_generation_step_seconds", "Seconds per engine step")


def record_step(rows: int, seconds: float) -> None:
    GEN_STEP_ROWS.observe(rows)
    GEN_STEP_SECONDS.observe(seconds)
