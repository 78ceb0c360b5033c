"""Sentence-embedding models: BERT-style encoders, pooled and normalised as the folder's
sentence-transformers modules say (mean, cls, max or lasttoken pooling; L2 normalisation
when a Normalize module is listed), mean pooling + L2 normalisation for a plain encoder
(``jobs.fleet.pooling.read_pooling``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from jobs.fleet import builtin_models, publishing
from jobs.fleet.pooling import read_pooling
from workers.models import precision as precisions
from workers.models.embedding_inputs import EmbeddingInputs, check_dimensions
from workers.models.faults import inject_oom

__all__ = ["EmbeddingModel", "check_dimensions", "packaged_path"]


def packaged_path(model_id: str) -> Path:
    """The files of a builtin model that ship ready to serve in an installed package."""
    b = builtin_models.BUILTIN.get(model_id)
    if b is None or b.package_dir is None:
        raise KeyError(f"{model_id!r} is not a packaged builtin model: pass its directory")
    return b.package_dir()


class EmbeddingModel(EmbeddingInputs):
    """Loaded once per worker process; ``embed`` is called by the engine thread only.

    ``path``: the model's directory (workers.models.cache.local_dir of its registry
    version); a packaged builtin's own files when None. ``max_length``: the context
    length the registry records for it (read from the directory when None).
    ``precision``: the registry version's (workers.models.precision)."""

    def __init__(self, model_id: str, path: Path | None = None, max_length: int | None = None,
                 fault_oom_above_tokens: int = 0, fault_fail: bool = False,
                 precision: str = "fp32") -> None:
        path = path or packaged_path(model_id)
        self.model_id = model_id
        self.precision = precision
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        precisions.check(precision, self.device)
        self.model = precisions.apply(AutoModel.from_pretrained(str(path)).eval().to(self.device),
                                      precision, self.device)
        self.max_length = max_length or publishing.read_context_length(path)
        self.pooling = read_pooling(path)
        self.dim = int(self.model.config.hidden_size)
        self.vocab_size = int(self.model.config.vocab_size)  # rows of the embedding table
        self.cls = self.tokenizer.cls_token_id
        self.sep = self.tokenizer.sep_token_id
        self.pad = self.tokenizer.pad_token_id or 0
        # Fault injection for tests: behave as if memory ran out above this many padded
        # tokens in one forward pass (0: off).
        self.fault_oom_above_tokens = fault_oom_above_tokens
        self.fault_fail = fault_fail  # tests: every forward pass fails (a broken device)

    @torch.inference_mode()
    def embed(self, batch: list[list[int]]) -> np.ndarray:
        """One forward pass over a micro-batch; rows are float32, pooled (and normalised)
        as ``self.pooling`` says."""
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
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        pooled = pool(hidden, mask, self.pooling.mode)
        if self.pooling.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One vector per row of right-padded token states ``hidden`` (rows x width x dim),
    ``mask`` marking the real tokens: as sentence-transformers' Pooling does."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(m == 0, -1e9).max(1).values
    if mode == "lasttoken":
        last = (mask.sum(1) - 1).clamp(min=0)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling {mode!r}")
