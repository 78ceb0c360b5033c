"""What an embeddings request may hold for one model, checked before the engine: the
model, the output size, the token ids and each input's length. Shared by the real model
(``workers.models.embeddings``) and the simulated one (``workers.models.simulated``).

No torch at import time: a simulated worker imports this module.
"""

from __future__ import annotations

from typing import Any, cast

from jobs.core.errors import InvalidRequest, ModelNotLoaded
from jobs.protocol.embeddings import EmbeddingsBody
from workers.models.token_count import embedding_ids


def check_dimensions(dimensions: int | None, model_id: str, dim: int) -> None:
    """Refuse an output size larger than the model's (a smaller one is served by cutting
    and renormalising each vector). Validation at the door checks only ``>= 1``: the
    worker holding the model is what knows its size."""
    if dimensions is not None and dimensions > dim:
        raise InvalidRequest(f"dimensions is {dimensions}, but {model_id} produces "
                             f"{dim}-dimensional embeddings: ask for at most {dim}",
                             param="dimensions")


class EmbeddingInputs:
    """An embedding model's request checks and tokenization. A subclass sets
    ``model_id``, ``tokenizer``, ``max_length``, ``dim`` and ``vocab_size``."""

    model_id: str
    tokenizer: Any
    max_length: int
    dim: int
    vocab_size: int  # rows of the embedding table

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
