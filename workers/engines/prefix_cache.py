"""Shared-prefix reuse for the generation engine: key/value state kept per block of
prompt tokens, so a sequence whose prompt starts like an earlier one's (a batch's
shared instruction, a chat's system prompt, a preempted sequence resuming) computes
only the rest.

The cache is a tree of blocks of ``block`` tokens. A node is one block, keyed by its
parent node and its tokens, so a node stands for exactly the token prefix on the
path to it (no hashing of prefixes, no collisions) and holds that block's keys and
values. A lookup walks the tree along the prompt's full blocks; the state of the
longest match is the concatenation of the blocks' tensors. Key/value state at a
position depends only on the tokens up to it (causal attention) and on its position
(0-based within the sequence, as the engine computes them), so a block computed in
any batch is valid for every sequence with the same prefix.

Bounded in bytes: inserting beyond ``max_bytes`` evicts least recently used leaves
(a block whose longer continuations are gone) until it fits. Only the engine thread
uses it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from workers.models.chat import KV, Past


@dataclass
class _Node:
    id: int
    parent: int  # 0: the root
    tokens: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # [1, heads, block, dim] each
    nbytes: int
    used: int  # the clock at its latest use
    children: int = 0


@dataclass
class CacheStats:
    lookups: int = 0
    hit_tokens: int = 0  # prompt tokens whose state came from the cache
    looked_up_tokens: int = 0  # prompt tokens of the lookups
    inserted_blocks: int = 0
    evicted_blocks: int = 0
    bytes: int = 0
    blocks: int = 0

    def snapshot(self) -> dict[str, int | float]:
        return {"lookups": self.lookups, "hit_tokens": self.hit_tokens,
                "looked_up_tokens": self.looked_up_tokens,
                "hit_rate": self.hit_tokens / self.looked_up_tokens
                if self.looked_up_tokens else 0.0,
                "inserted_blocks": self.inserted_blocks,
                "evicted_blocks": self.evicted_blocks, "bytes": self.bytes,
                "blocks": self.blocks}


WORTH_TOKENS = 64


@dataclass
class PrefixCache:
    max_bytes: int
    block: int = 16
    # A match shorter than this is computed again: taking it costs about what it saves
    # (measured on the mixed workload of bench.generation), and the rows' differing
    # pasts widen the batch's cache. Workers use WORTH_TOKENS.
    min_hit_tokens: int = 0
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        self._nodes: dict[int, _Node] = {}
        self._index: dict[tuple[int, tuple[int, ...]], int] = {}
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)

    def _walk(self, tokens: list[int], limit: int) -> list[_Node]:
        """The nodes of the longest cached prefix of ``tokens`` within ``limit`` tokens."""
        path: list[_Node] = []
        parent = 0
        for start in range(0, limit - limit % self.block, self.block):
            nid = self._index.get((parent, tuple(tokens[start: start + self.block])))
            if nid is None:
                break
            path.append(self._nodes[nid])
            parent = nid
        return path

    def cached(self, tokens: list[int]) -> int:
        """How many leading tokens of ``tokens`` a lookup would take from the cache (at
        most all but the last, whose logits the prefill must compute)."""
        n = len(self._walk(tokens, len(tokens) - 1)) * self.block
        return n if n >= self.min_hit_tokens else 0

    def lookup(self, tokens: list[int], limit: int | None = None) -> Past | None:
        """The state of the longest cached prefix of ``tokens`` (all but the last token
        at most, and at most ``limit``), or None."""
        cap = len(tokens) - 1 if limit is None else min(limit, len(tokens) - 1)
        path = self._walk(tokens, max(cap, 0))
        self.stats.lookups += 1
        self.stats.looked_up_tokens += len(tokens)
        if not path or len(path) * self.block < self.min_hit_tokens:
            return None
        now = next(self._clock)
        for n in path:
            n.used = now
        self.stats.hit_tokens += len(path) * self.block
        layers = [(torch.cat([n.layers[i][0] for n in path], dim=2),
                   torch.cat([n.layers[i][1] for n in path], dim=2))
                  for i in range(len(path[0].layers))]
        return Past(layers)

    def insert(self, tokens: list[int], kv: KV, row: int) -> None:
        """Keep the full blocks of ``tokens`` whose state is row ``row`` of ``kv`` (its
        unmasked columns, in order: the state a prefill of ``tokens`` produced)."""
        n_blocks = len(tokens) // self.block
        if n_blocks == 0 or self.max_bytes <= 0:
            return
        cols = kv.mask[row].nonzero().squeeze(1)
        parent, now = 0, next(self._clock)
        for b in range(n_blocks):
            start = b * self.block
            key = (parent, tuple(tokens[start: start + self.block]))
            nid = self._index.get(key)
            if nid is None:
                idx = cols[start: start + self.block]
                layers = [(k[row: row + 1].index_select(2, idx).clone(),
                           v[row: row + 1].index_select(2, idx).clone())
                          for k, v in kv.layers]
                size = sum(k.nbytes + v.nbytes for k, v in layers)
                if not self._make_room(size, keep=parent):
                    return
                nid = next(self._ids)
                self._nodes[nid] = _Node(nid, parent, key[1], layers, size, now)
                self._index[key] = nid
                if parent:
                    self._nodes[parent].children += 1
                self.stats.inserted_blocks += 1
                self.stats.bytes += size
                self.stats.blocks += 1
            else:
                self._nodes[nid].used = now
            parent = nid

    def _make_room(self, size: int, keep: int) -> bool:
        """Evict least recently used leaves (never ``keep`` or its ancestors, the path
        being inserted) until ``size`` more bytes fit; False when they cannot."""
        if size > self.max_bytes:
            return False
        protected = set()
        n = keep
        while n:
            protected.add(n)
            n = self._nodes[n].parent
        while self.stats.bytes + size > self.max_bytes:
            leaves = [x for x in self._nodes.values()
                      if x.children == 0 and x.id not in protected]
            if not leaves:
                return False
            self._evict(min(leaves, key=lambda x: x.used))
        return True

    def _evict(self, n: _Node) -> None:
        del self._nodes[n.id]
        del self._index[(n.parent, n.tokens)]
        if n.parent:
            self._nodes[n.parent].children -= 1
        self.stats.bytes -= n.nbytes
        self.stats.blocks -= 1
        self.stats.evicted_blocks += 1

    def clear(self) -> None:
        self._nodes.clear()
        self._index.clear()
        self.stats.bytes = self.stats.blocks = 0
