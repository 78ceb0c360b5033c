"""The batch policy: length-bucketed micro-batches under a padded-token budget.

Contract: every input index appears in exactly one micro-batch; a micro-batch
holds at most ``max_rows`` rows, at most ``max_tokens`` padded tokens (rows x
longest row; a single row longer than the budget runs alone), and at least
``min_fill`` of its padded tokens are real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPolicy:
    max_tokens: int = 8192
    max_rows: int = 128
    min_fill: float = 0.9

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group indices of ``lengths`` into micro-batches, shortest rows first."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        batches: list[list[int]] = []
        cur: list[int] = []
        real = 0
        for i in order:
            n = lengths[i]
            if cur:
                rows = len(cur) + 1
                padded = n * rows
                if rows > self.max_rows or padded > self.max_tokens or \
                        (real + n) < self.min_fill * padded:
                    batches.append(cur)
                    cur, real = [], 0
            cur.append(i)
            real += n
        if cur:
            batches.append(cur)
        return batches


def arrival_order(lengths: Sequence[int], rows: int) -> list[list[int]]:
    """The baseline a naive server uses: fixed-size batches in arrival order."""
    return [list(range(i, min(i + rows, len(lengths)))) for i in range(0, len(lengths), rows)]


def padding_stats(lengths: Sequence[int], batches: list[list[int]]) -> tuple[int, int]:
    """(real tokens, computed tokens) for a set of micro-batches."""
    real = sum(lengths)
    computed = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return real, computed
