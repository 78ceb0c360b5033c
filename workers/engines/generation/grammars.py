"""Structured outputs on the transformers generation engine (``Grammars``): an
llguidance matcher per constrained sequence, and the mask each step applies to the
scores of its constrained rows."""

from __future__ import annotations

import threading
from typing import Any

import torch

from jobs.protocol.structured import Constraint
from workers.models.chat import ChatModel


class Grammars:
    """Structured outputs on this engine (jobs.protocol.structured): llguidance matchers
    over the model's tokenizer, and the mask of each step's constrained rows."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def matcher(self, c: Constraint) -> Any:
        import llguidance

        return llguidance.LLMatcher(self.tokenizer(), c.grammar())

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                cfg = getattr(getattr(self.model, "model", None), "config", None)
                tok: Any = self.model.tokenizer
                self._tokenizer = llguidance.hf.from_tokenizer(
                    tok, n_vocab=getattr(cfg, "vocab_size", None))
            return self._tokenizer

    @staticmethod
    def mask(logits: torch.Tensor, matchers: list[Any]) -> None:
        """Set the scores of the tokens each row's matcher forbids to -inf, in place
        (a row without a matcher is left as it is)."""
        import llguidance.torch as lt

        bits = lt.allocate_token_bitmask(len(matchers), logits.shape[-1])
        for i, m in enumerate(matchers):
            if m is not None:
                lt.fill_next_token_bitmask(m, bits, i)
        lt.apply_token_bitmask_inplace(logits, bits.to(logits.device))
