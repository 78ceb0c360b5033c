"""The prefix cache's bookkeeping on synthetic key/value state: what a lookup returns,
that it never covers a prompt's last token, the byte bound and which blocks go first."""

from __future__ import annotations

import torch

from workers.engines.prefix_cache import PrefixCache
from workers.models.chat import KV

HEADS, DIM, LAYERS = 2, 4, 2


def state(tokens: list[int], pad: int = 0) -> KV:
    """Row 0's state of ``tokens`` behind ``pad`` masked columns: column i of the
    unmasked part holds the value tokens[i] (so a returned block shows its origin)."""
    n = len(tokens)
    val = torch.tensor([0.0] * pad + [float(t) for t in tokens])
    k = val.view(1, 1, -1, 1).expand(1, HEADS, pad + n, DIM).clone()
    mask = torch.tensor([[0] * pad + [1] * n])
    return KV([(k, -k) for _ in range(LAYERS)], mask)


def test_lookup_returns_the_longest_cached_run_of_full_blocks() -> None:
    c = PrefixCache(1 << 20, block=4)
    prompt = list(range(1, 12))  # 11 tokens: two full blocks
    c.insert(prompt, state(prompt, pad=3), 0)  # padding columns are not cached
    assert c.stats.blocks == 2
    hit = c.lookup(prompt + [50, 51])
    assert hit is not None and hit.length == 8
    assert hit.layers[0][0][0, 0, :, 0].tolist() == [float(t) for t in prompt[:8]]
    assert torch.equal(hit.layers[1][1], -hit.layers[1][0])
    assert c.cached([1, 2, 3, 4, 5, 6, 99, 8, 9]) == 4  # diverges inside block 2
    assert c.lookup([9, 9, 9, 9, 9]) is None
    assert c.stats.hit_tokens == 8


def test_a_lookup_leaves_at_least_the_last_token_to_compute() -> None:
    c = PrefixCache(1 << 20, block=4)
    prompt = list(range(1, 9))  # exactly two blocks
    c.insert(prompt, state(prompt), 0)
    assert c.cached(prompt) == 4  # the last token's logits must be computed
    hit = c.lookup(prompt)
    assert hit is not None and hit.length == 4
    assert c.lookup(prompt, limit=3) is None


def test_the_byte_bound_evicts_least_recently_used_leaves_first() -> None:
    one = PrefixCache(1 << 20, block=4)
    one.insert([1, 2, 3, 4], state([1, 2, 3, 4]), 0)
    size = one.stats.bytes  # one block
    c = PrefixCache(3 * size, block=4)
    a, b = [1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 3, 3, 3, 3]  # share their first block
    c.insert(a, state(a), 0)
    c.insert(b, state(b), 0)
    assert c.stats.blocks == 3 and c.stats.bytes == 3 * size
    assert c.lookup(a + [0]) is not None  # a's leaf is now more recent than b's
    d = [7, 7, 7, 7]
    c.insert(d, state(d), 0)
    assert c.stats.bytes <= c.max_bytes and c.stats.evicted_blocks == 1
    assert c.cached(b + [0]) == 4 and c.cached(a + [0]) == 8  # b's leaf went, not a's
    assert c.cached(d + [0]) == 4
    # a block larger than the whole bound is not kept, and evicts nothing
    tiny = PrefixCache(size - 1, block=4)
    tiny.insert(d, state(d), 0)
    assert tiny.stats.blocks == 0 and tiny.stats.evicted_blocks == 0


def test_an_inserted_path_is_never_evicted_to_make_room_for_its_own_blocks() -> None:
    one = PrefixCache(1 << 20, block=4)
    one.insert([1, 2, 3, 4], state([1, 2, 3, 4]), 0)
    size = one.stats.bytes
    c = PrefixCache(2 * size, block=4)
    long = list(range(1, 17))  # four blocks, room for two
    c.insert(long, state(long), 0)
    assert c.stats.blocks == 2 and c.cached(long + [0]) == 8


def test_a_match_shorter_than_the_minimum_is_computed_again() -> None:
    c = PrefixCache(1 << 20, block=4, min_hit_tokens=8)
    prompt = list(range(1, 14))  # three full blocks
    c.insert(prompt, state(prompt), 0)
    assert c.cached([1, 2, 3, 4, 99, 98]) == 0  # one block matches: below the minimum
    assert c.lookup([1, 2, 3, 4, 99, 98]) is None
    assert c.cached(prompt + [7]) == 12
    hit = c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 99])
    assert hit is not None and hit.length == 8
    assert c.stats.hit_tokens == 8
