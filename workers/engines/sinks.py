"""What a generation engine tells of a request's output, on either engine: why a
sequence ended (``FinishReason``), what it used (``Usage``), the sinks that receive it
(``Sink``; ``ChoiceSink`` for a request that fans out into choices), and ``Collect``,
the sink that gathers a whole answer (batch shards and jobs)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from workers.engines.responses import Choice, TokenLogprob


class FinishReason(StrEnum):
    """Why a sequence ended (the OpenAI ``finish_reason``)."""

    STOP = "stop"  # an end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens or the context window


class Sink(Protocol):
    """Receives a sequence's output; called on the engine thread, must not block.

    A sink may also have ``abandoned(usage)``: called, instead of ``finish``, with
    what the sequence used when the engine drops it because ``cancelled()`` is true
    (a stream whose client went away is billed for what was generated)."""

    def start(self) -> None: ...
    def delta(self, text: str) -> None: ...
    def finish(self, reason: FinishReason, usage: Usage) -> None: ...
    def fail(self, error: Exception) -> None: ...
    def cancelled(self) -> bool: ...


class ChoiceSink(Sink, Protocol):
    """The sink of a request that fans out (``GenRequest.fans``): told of each choice's
    text and tokens (``tokens`` None when no log probabilities were asked for) and of its
    end, before ``finish`` (the first choice's reason, every sequence's usage)."""

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None: ...
    def choice_end(self, index: int, reason: str) -> None: ...


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    batch_rows: int  # the most rows of any engine step this sequence was part of
    # Its share of the engine steps it took part in: each step's time split among the
    # step's sequences by their tokens in it (a prefill's length, 1 for a decode).
    accelerator_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens taken from the engine's prefix cache


class Collect:
    """A sink that gathers the whole answer (batch shards and jobs): its ``choices``
    (one unless the request fanned out), ``text`` and ``reason`` the first's, and while
    it runs the tokens generated so far (``generated``: what a batch row resumes from)."""

    def __init__(self, on_done: Callable[[Collect], object] | None = None) -> None:
        self.choices: list[Choice] = [Choice(0)]
        self.parts: list[str] = self.choices[0].parts
        self.reason: str = ""
        self.usage = Usage(0, 0, 0)
        self.error: Exception | None = None
        self.event = threading.Event()
        self.on_done = on_done
        self._cancelled = False
        self._generated: list[int] | None = None

    def follow(self, generated: list[int]) -> None:
        """Told by the engine of the list its sequence's tokens are appended to (a
        request that does not fan out), read by ``generated``."""
        self._generated = generated

    def generated(self) -> list[int]:
        """The tokens generated so far (a copy, read from any thread), resumed ones
        included; none for a request that fans out."""
        return list(self._generated) if self._generated is not None else []

    def start(self) -> None:
        return None

    def delta(self, text: str) -> None:
        self.parts.append(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        self._choice(index).add(text, tokens)

    def choice_end(self, index: int, reason: str) -> None:
        self._choice(index).reason = reason

    def _choice(self, index: int) -> Choice:
        while len(self.choices) <= index:
            self.choices.append(Choice(len(self.choices)))
        return self.choices[index]

    def finish(self, reason: FinishReason, usage: Usage) -> None:
        self.reason, self.usage = reason, usage
        self.choices[0].reason = self.choices[0].reason or str(reason)
        self._done()

    def fail(self, error: Exception) -> None:
        self.error = error
        self._done()

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled

    def _done(self) -> None:
        self.event.set()
        if self.on_done is not None:
            self.on_done(self)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def result(self, timeout: float | None = None) -> Any:
        if not self.event.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        if self.error is not None:
            raise self.error
        return self
