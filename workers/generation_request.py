"""A generation request: what the engine runs for one sequence, built from a chat or
completions body and checked against the model's template and context window.

Built by every lane that generates (realtime, jobs, batch shards) before it submits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobs.errors import InvalidRequest
from jobs.requests import CHAT, ChatBody, parse_generation
from workers.runtime.token_count import template_messages

if TYPE_CHECKING:  # torch-bound (a simulated worker never imports torch)
    from workers.runtime.chat import ChatModel


@dataclass
class GenRequest:
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


def build_request(model: ChatModel, endpoint: str, body: dict[str, Any]) -> GenRequest:
    """Validate a chat/completions body against the model (template, context window)."""
    req = parse_generation(endpoint, body)
    if endpoint == CHAT:
        assert isinstance(req, ChatBody)
        prompt = model.chat_ids(template_messages(req))
    else:
        prompt = model.prompt_ids(str(req.prompt))  # type: ignore[union-attr]
    room = model.context_length - len(prompt)
    if room < 1:
        raise InvalidRequest(f"the prompt is {len(prompt)} tokens; this model's context is "
                             f"{model.context_length} tokens", param="messages"
                             if endpoint == CHAT else "prompt", code="context_length_exceeded")
    limit = req.token_limit()
    if limit is not None and limit > room:
        raise InvalidRequest(f"max_tokens is {limit}, but the prompt leaves {room} tokens of the "
                             f"{model.context_length}-token context", param="max_tokens",
                             code="context_length_exceeded")
    return GenRequest(prompt=prompt, max_new_tokens=limit or room,
                      temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                      stop=req.stops())
