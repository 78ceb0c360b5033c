"""Arrow work over a dataset's record batches, shared by its views and its copies.

A column as text (``as_text``), a template rendered row-wise (``render``), and the
custom_ids' 64-bit hashes (``text_hashes``, ``Ids``) by which repeats are found
(``find_repeats``: the strings compared only for the hashes seen twice).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.batches.datasets import Bad
from jobs.core.errors import shown

HASH_BASE = np.uint64(0x100000001B3)
HASH_LEN = np.uint64(0x9E3779B97F4A7C15)


def text_hashes(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each string of ``a`` (a polynomial over its bytes, computed
    over the Arrow buffers: no Python string is made, the GIL is free). Equal strings
    hash alike; a null hashes as the empty string."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    bufs = a.buffers()
    wide = pa.types.is_large_string(a.type) or pa.types.is_large_binary(a.type)
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[
        a.offset: a.offset + len(a) + 1].astype(np.int64)
    lens = np.diff(offsets)
    if a.null_count:
        lens[pc.is_null(a).to_numpy(zero_copy_only=False)] = 0
    h = lens.astype(np.uint64) * HASH_LEN
    start = offsets[0] if len(offsets) else 0
    if bufs[2] is None or not lens.any():
        return h
    data = np.frombuffer(bufs[2], dtype=np.uint8)[start:offsets[-1]]
    nz = lens > 0
    keep = np.repeat(nz, np.diff(offsets))  # bytes of nulls (if any) are skipped
    row_starts = np.cumsum(np.concatenate(([0], lens[:-1])))
    pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(row_starts, lens)
    powers = np.cumprod(np.full(int(lens.max()), HASH_BASE, dtype=np.uint64))
    contrib = (data[keep].astype(np.uint64) + np.uint64(1)) * powers[pos]
    h[nz] += np.add.reduceat(contrib, row_starts[nz])
    return h


@dataclass
class Ids:
    """Every custom_id's 64-bit hash (8 bytes a row, not the strings); ``repeated``
    says which hashes were seen twice, for a second look at those rows only."""

    chunks: list[np.ndarray] = field(default_factory=list)

    def add(self, ids: pa.Array | pa.ChunkedArray) -> None:
        self.chunks.append(np.sort(text_hashes(ids)))  # sorted runs merge fast below

    def repeated(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, np.uint64)
        h = np.concatenate(self.chunks)
        h.sort(kind="stable")  # a merge of the sorted runs
        return np.unique(h[1:][h[1:] == h[:-1]])


def find_repeats(ids: Ids, columns: Iterator[pa.Array]) -> list[tuple[int, str]]:
    """(row, message) of each custom_id seen before, at most a hundred. ``columns``:
    the id column again, a record batch at a time in order (as text); only the rows
    whose hash was seen twice are looked at as strings."""
    repeated = ids.repeated()
    if not len(repeated):
        return []
    seen: dict[str, int] = {}
    out: list[tuple[int, str]] = []
    line = 0
    for col in columns:
        hit = np.flatnonzero(np.isin(text_hashes(col), repeated))
        for i, cid in zip(hit.tolist(), col.take(pa.array(hit)).to_pylist(), strict=True):
            n = line + i + 1
            if not cid:
                continue
            if cid in seen:
                out.append((n, f"custom_id {shown(cid)} (the id column) appears more than "
                               f"once: rows {seen[cid]} and {n}"))
                if len(out) >= 100:
                    return out
            else:
                seen[cid] = n
        line += len(col)
    return out


def as_text(col: pa.Array | pa.ChunkedArray, what: str) -> pa.Array:
    """A column as UTF-8 text: strings as they are, numbers and booleans printed."""
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_decimal(t) or pa.types.is_null(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_dictionary(t)):
        try:
            return pc.cast(col, pa.string())
        except pa.ArrowInvalid:
            pass
    raise Bad("invalid_dataset", f"{what} is of type {t}: it must be text (or numbers)")


def render(rb: pa.RecordBatch, pieces: list[tuple[str, str | None]]) -> pa.Array:
    """The template over a record batch: literal pieces and columns joined, row-wise."""
    args: list[Any] = []
    for lit, name in pieces:
        if lit:
            args.append(lit)
        if name is not None:
            args.append(as_text(rb.column(name), f"the template's column {shown(name)}"))
    if len(args) == 1 and not isinstance(args[0], str):
        return pc.fill_null(args[0], "")
    return pc.binary_join_element_wise(*args, "", null_handling="replace",
                                       null_replacement="")
