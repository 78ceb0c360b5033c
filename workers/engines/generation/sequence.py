"""One sequence on the transformers generation engine (``Seq``): its request and sink,
what it generated and delivered, its state between the chunks of a chunked prefill, and
the accelerator time charged to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workers.engines.request import GenRequest
from workers.engines.responses import TokenLogprob
from workers.engines.sinks import Sink, Usage
from workers.models.chat import Past


@dataclass
class Seq:
    req: GenRequest
    sink: Sink
    priority: int
    order: int
    generated: list[int] = field(default_factory=list)
    emitted: int = 0  # characters of decoded text already delivered
    gen: torch.Generator | None = None
    pos: int = 0
    done: bool = False
    rows: int = 0
    started: bool = False
    accel_s: float = 0.0  # accelerator-seconds charged so far
    # Chunked prefill: the state of the first tokens computed in earlier steps, and
    # how far this step's chunk goes (None: to the end, then the sequence joins).
    past: Past | None = None
    chunk_to: int | None = None
    counts: dict[int, int] = field(default_factory=dict)  # generated tokens (penalties)
    logprob_sum: float = 0.0  # of the sampled tokens, when scored (best_of's ranking)
    pending: list[TokenLogprob] = field(default_factory=list)  # not yet delivered
    text_len: int = 0  # characters of the decoded text before the last token
    # Structured outputs: the llguidance matcher of its constraint, fed every token it
    # generated. It stays with the sequence when it is preempted and resumes.
    matcher: Any = None

    def usage(self) -> Usage:
        return Usage(len(self.req.prompt), len(self.generated), self.rows, self.accel_s)

    def tokens(self) -> list[int]:
        """What a (re)starting prefill runs: the prompt plus anything generated."""
        return self.req.prompt + self.generated
