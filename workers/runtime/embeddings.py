"""Sentence-embedding models (BERT-style encoders, mean pooling, L2 norm)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from jobs import registry
from jobs.errors import InvalidRequest, ModelNotLoaded
from jobs.requests import EmbeddingsBody
from workers.runtime import precision as precisions
from workers.runtime.faults import inject_oom
from workers.runtime.token_count import embedding_ids


def packaged_path(model_id: str) -> Path:
    """The files of a builtin model that ship ready to serve in an installed package."""
    b = registry.BUILTIN.get(model_id)
    if b is None or b.package_dir is None:
        raise KeyError(f"{model_id!r} is not a packaged builtin model: pass its directory")
    return b.package_dir()


def check_dimensions(dimensions: int | None, model_id: str, dim: int) -> None:
    """Refuse an output size larger than the model's (a smaller one is served by cutting
    and renormalising each vector). Validation at the door checks only ``>= 1``: the
    worker holding the model is what knows its size."""
    if dimensions is not None and dimensions > dim:
        raise InvalidRequest(f"dimensions is {dimensions}, but {model_id} produces "
                             f"{dim}-dimensional embeddings: ask for at most {dim}",
                             param="dimensions")


class EmbeddingModel:
    """Loaded once per worker process; ``embed`` is called by the engine thread only.

    ``path``: the model's directory (workers.runtime.cache.local_dir of its registry
    version); a packaged builtin's own files when None. ``max_length``: the context
    length the registry records for it (read from the directory when None).
    ``precision``: the registry version's (workers.runtime.precision)."""

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
        self.max_length = max_length or registry.read_context_length(path)
        self.dim = int(self.model.config.hidden_size)
        self.vocab_size = int(self.model.config.vocab_size)  # rows of the embedding table
        self.cls = self.tokenizer.cls_token_id
        self.sep = self.tokenizer.sep_token_id
        self.pad = self.tokenizer.pad_token_id or 0
        # Fault injection for tests: behave as if memory ran out above this many padded
        # tokens in one forward pass (0: off).
        self.fault_oom_above_tokens = fault_oom_above_tokens
        self.fault_fail = fault_fail  # tests: every forward pass fails (a broken device)

    def prepare(self, req: EmbeddingsBody) -> list[list[int]]:
        """A request's token ids, after refusing what this model cannot serve (another
        model, too many dimensions, token ids outside the vocabulary, inputs over the
        context): every lane calls this before the engine."""
        if req.model != self.model_id:
            raise ModelNotLoaded(req.model)
        check_dimensions(req.dimensions, self.model_id, self.dim)
        inputs = req.inputs()
        if inputs and isinstance(inputs[0], list):
            self.check_token_ids(cast(list[list[int]], inputs))
        return self.tokenize(inputs)

    def check_token_ids(self, inputs: list[list[int]]) -> None:
        """Refuse ids the model has no embedding for (validation checks only < 2^31)."""
        for i, ids in enumerate(inputs):
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                where = "input" if len(inputs) == 1 else f"input[{i}]"
                raise InvalidRequest(
                    f"{where} holds token id {bad}, but {self.model_id}'s vocabulary has "
                    f"{self.vocab_size} tokens: ids must be below {self.vocab_size}",
                    param="input", code="invalid_token_id")

    def tokenize(self, inputs: list[str] | list[list[int]]) -> list[list[int]]:
        """Token ids with special tokens; an input longer than the model's context is
        refused (InvalidRequest, as OpenAI does), never silently truncated."""
        out = embedding_ids(self.tokenizer, inputs)  # as batch validation counts them
        for i, ids in enumerate(out):
            if len(ids) > self.max_length:
                where = "input" if len(out) == 1 else f"input[{i}]"
                raise InvalidRequest(
                    f"{where} is {len(ids)} tokens long; {self.model_id} takes at most "
                    f"{self.max_length} tokens per input (its context length, special tokens "
                    "included). Shorten or split it", param="input",
                    code="context_length_exceeded")
        return out

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
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        m = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()
