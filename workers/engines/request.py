"""A generation request: what the engine runs for one request, built from a chat or
completions body and checked against the model's template, context window and
vocabulary (``logit_bias`` names token ids of the model's tokenizer).

Built by every lane that generates (realtime, jobs, batch shards) before it submits.
A request is ``best_of`` sequences (``n`` when best_of is not set) sharing the prompt;
the engine returns ``n`` choices of them (workers.engines.fanout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobs.core.errors import InvalidRequest
from jobs.protocol.endpoints import CHAT
from jobs.protocol.generation import ChatBody, CompletionBody
from jobs.protocol.limits import longest_token, refuse_long_prompt
from jobs.protocol.parsing import parse_generation
from jobs.protocol.structured import Constraint, constraint
from jobs.protocol.tool_use import tools_of
from jobs.protocol.tools import no_tools
from workers.models.token_count import template_messages, template_tools

if TYPE_CHECKING:  # torch-bound (a simulated worker never imports torch)
    from workers.models.chat import ChatTokens


@dataclass
class GenRequest:
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    # Alternatives reported per token with its log probability (None: no logprobs).
    logprobs: int | None = None
    n: int = 1  # choices returned
    best_of: int = 1  # sequences generated (>= n): the n of highest mean logprob return
    echo: bool = False  # completions: the prompt before each choice's text
    text: str = ""  # completions: the prompt's text (echoed; where text offsets start)
    # What the answer must be (chat's response_format): None, any text.
    constraint: Constraint | None = None
    # The project it is billed to: realtime rows are shared among projects
    # (workers.engines.scheduling); "" for work of no project's realtime request.
    project: str = ""
    # Tokens an earlier attempt generated for this request (a batch row resumed after
    # its worker was interrupted, workers/shards/rows.py): the engine continues after
    # them as if it had generated them itself. Only for a ``resumable`` request.
    resume: list[int] = field(default_factory=list)

    def processed(self) -> bool:
        """Its scores are changed before sampling (penalties or bias)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    def scored(self) -> bool:
        """Each sampled token's log probability is needed (reported, or to rank)."""
        return self.logprobs is not None or self.best_of > self.n

    def resumable(self) -> bool:
        """Whether its answer can be continued from tokens generated earlier and come out
        as an uninterrupted run's would: one plain sequence (no choices, log
        probabilities or echo), nothing that depends on which tokens came before in this
        run (penalties, bias, a constraint's grammar state, stop strings that may span the
        break) and either greedy or unseeded (a seeded sample is reproduced only by
        running it from its start)."""
        return not (self.fans() or self.processed() or self.constraint is not None
                    or self.stop or (self.seed is not None and self.temperature > 0))

    def fans(self) -> bool:
        """More than the one plain sequence: choices, log probabilities or an echo."""
        return self.best_of > 1 or self.logprobs is not None or self.echo


def build_request(model: ChatTokens, endpoint: str, body: dict[str, Any]) -> GenRequest:
    """Validate a chat/completions body against the model (template, context window)."""
    req = parse_generation(endpoint, body)
    # no token is longer than the longest in the vocabulary: a prompt of more bytes
    # than that many times the context cannot fit, and is refused untokenized
    refuse_long_prompt(endpoint, body, model.model_id,
                       model.context_length * longest_token(model))
    if endpoint == CHAT:
        assert isinstance(req, ChatBody)
        if req.uses_tools() and not model.renders_tools():
            raise no_tools(model.model_id)
        prompt = model.chat_ids(template_messages(req), template_tools(req))
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
    bias = req.token_bias()
    if bias and (bad := sorted(t for t in bias if t >= model.vocab_size)):
        raise InvalidRequest(f"logit_bias: token {bad[0]} is not in this model's vocabulary "
                             f"({model.vocab_size} tokens: ids 0 to "
                             f"{model.vocab_size - 1})", param="logit_bias")
    out = GenRequest(prompt=prompt, max_new_tokens=limit or room,
                     temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                     stop=req.stops(), presence_penalty=req.presence_penalty,
                     frequency_penalty=req.frequency_penalty, logit_bias=bias,
                     logprobs=req.top_count(), n=req.n, best_of=req.n)
    if isinstance(req, ChatBody):
        tools = tools_of(req.model_dump(exclude_none=True))
        out.constraint = (tools.constraint() if tools is not None and tools.forced()
                          else constraint(req.response_format))
    if isinstance(req, CompletionBody):
        out.best_of, out.echo, out.text = req.candidates(), req.echo, str(req.prompt)
    return out
