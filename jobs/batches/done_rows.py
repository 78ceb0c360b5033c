"""Which of a shard's rows its checkpoints committed.

A shard's rows have fixed positions (the order ``read_shard`` returns them in). A
chunked shard (embeddings) commits a prefix of them, chunk after chunk:
``rows_done`` says how far. A generation shard commits rows as they finish, out of
order (workers/shards/rows.py): its ``done_rows`` holds the committed positions as
sorted, disjoint ``[start, end)`` ranges (a few ranges, since rows finish roughly
in order), written by the same fenced UPDATE as the commit. ``done_rows`` NULL means
the prefix ``[0, rows_done)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobs.batches.views import read_shard
from jobs.core.schema import Shard
from storage.objects import ObjectStore

Ranges = list[list[int]]


def positions(sh: Shard) -> set[int]:
    """The positions of the rows the checkpoints committed."""
    if sh.done_rows is None:
        return set(range(sh.rows_done))
    return {i for start, end in sh.done_rows for i in range(start, end)}


def ranges(done: Iterable[int]) -> Ranges:
    """``done`` (positions) as sorted, disjoint ``[start, end)`` ranges."""
    out: Ranges = []
    for i in sorted(set(done)):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def unrun(store: ObjectStore, sh: Shard) -> list[dict[str, Any]]:
    """The rows no checkpoint committed (each with its ``position``), in order."""
    if sh.done_rows is None:
        return [{**r, "position": sh.rows_done + i}
                for i, r in enumerate(read_shard(store, sh, start=sh.rows_done))]
    done = positions(sh)
    return [{**r, "position": i} for i, r in enumerate(read_shard(store, sh))
            if i not in done]
