"""The endpoints a request is for, what the served models tell a request's parser
(``ModelInfo``, ``ServedModels``), and a body's rough size (``text_length``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"  # run as a chat request (jobs.protocol.responses_request)
ENDPOINTS = (EMBEDDINGS, CHAT, COMPLETIONS, RESPONSES)


@dataclass(frozen=True)
class ModelInfo:
    """One servable model: its public name, its kind (embeddings | chat), whether its
    chat template renders tools (None: not known; the worker that renders it decides),
    whether it serves shortened vectors (``dimensions``) and the most bytes of prompt
    text a generation request for it may have (None: not bounded here; the worker
    that tokenizes it checks)."""

    name: str
    kind: str
    tools: bool | None = None
    matryoshka: bool = False
    max_prompt_bytes: int | None = None


# Which models exist and what they serve: the registry (jobs.fleet.catalog). A model's output
# size is known where it is loaded: the worker refuses ``dimensions`` above it.
class ServedModels(Protocol):
    """What parsing asks of the models served (``jobs.fleet.catalog.Catalog``)."""

    def require(self, name: str, endpoint: str, param: str = "model",
                versions: bool = False) -> ModelInfo: ...


def text_length(body: dict[str, Any]) -> int:
    """A cheap size estimate used to sort rows inside a shard (no tokenizer here)."""
    if isinstance(body.get("messages"), list):
        return sum(len(str(m.get("content", ""))) for m in body["messages"]
                   if isinstance(m, dict))
    v = body.get("input", body.get("prompt"))
    if isinstance(v, str):
        return len(v)
    if isinstance(v, list):
        return sum(len(x) if isinstance(x, str | list) else 1 for x in v)
    return 0
