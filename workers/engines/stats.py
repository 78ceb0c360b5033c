"""A generation engine's counters (``GenStats``): steps, tokens, prefills, what the
prefix cache saved and what out-of-memory and faulting passes cost; reported in the
worker's heartbeat, on either engine."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenStats:
    steps: int = 0
    prefills: int = 0
    tokens: int = 0
    tokens_by_priority: dict[int, int] = field(default_factory=dict)
    max_rows: int = 0
    oom_splits: int = 0  # prefills split in halves
    preemptions: int = 0  # sequences sent back to the queue by a decode step's OOM
    oom_failures: int = 0  # sequences that did not fit even alone
    yielded: int = 0  # realtime rows given up to another project's (its share of rows)
    fault_splits: int = 0  # passes that raised (not out of memory), run again in halves
    faults: int = 0  # sequences whose forward pass or sampling raised alone
    prefill_tokens: int = 0  # prompt tokens computed by prefills
    cached_tokens: int = 0  # prompt tokens whose state came from the prefix cache or chunks
    chunks: int = 0  # partial prefills of prompts longer than a step's prefill budget
    refills: int = 0  # sequences that took over a finished one's cache row in place
    compactions: int = 0  # times the cache was copied to drop finished rows
    step_s: float = 0.0
    recent_steps: deque[float] = field(default_factory=lambda: deque(maxlen=4096))

    def snapshot(self) -> dict[str, Any]:
        steps = sorted(self.recent_steps)
        p99 = steps[int(0.99 * (len(steps) - 1))] if steps else 0.0
        return {"steps": self.steps, "prefills": self.prefills, "tokens": self.tokens,
                "tokens_by_priority": {str(k): v for k, v in self.tokens_by_priority.items()},
                "max_rows": self.max_rows, "oom_splits": self.oom_splits,
                "preemptions": self.preemptions, "oom_failures": self.oom_failures,
                "yielded": self.yielded,
                "fault_splits": self.fault_splits, "faults": self.faults,
                "prefill_tokens": self.prefill_tokens, "cached_tokens": self.cached_tokens,
                "chunks": self.chunks, "refills": self.refills,
                "compactions": self.compactions,
                "step_s": self.step_s, "recent_step_p99_s": p99,
                "recent_step_p50_s": steps[len(steps) // 2] if steps else 0.0}
