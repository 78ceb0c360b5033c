"""Runners: how a chunk of batch rows is fed to an engine and turned into output lines.

``submit`` queues a chunk and returns at once (so the next chunk can be queued
while this one is written); ``collect`` waits for it and returns
(ok lines, error lines, completed, failed, tokens). ``tokens`` is the usage of
the ok lines (prompt and generated tokens apart), which the checkpoint records;
``collect`` also sets the chunk's ``seconds``, the accelerator-seconds of its ok
lines (what the chunk's usage record bills), and its ``faults``: the lines whose
request failed on the server's side (a 5xx), which the pipeline never commits as
error lines (it computes the chunk again). Lines are built by ``jobs.batches.outputs``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from jobs.batches import outputs
from jobs.batches.outputs import Tokens
from jobs.core.errors import InferqError
from jobs.protocol.parsing import parse_embeddings
from jobs.protocol.responses_request import as_chat
from jobs.protocol.tool_use import tools_of
from workers.engines.embeddings import seconds_of
from workers.engines.request import GenRequest, build_request
from workers.engines.responses import (
    embeddings_body,
    failure,
    generation_body,
    response_object,
    top_count,
)
from workers.engines.sinks import Collect

if TYPE_CHECKING:  # torch-bound (a simulated worker never imports torch)
    from workers.engines.interface import Engine

Lines = tuple[bytes, bytes, int, int, Tokens]


class Runner(Protocol):
    def submit(self, rows: list[dict[str, Any]], prio: int) -> Chunk: ...
    def done(self, chunk: Chunk, timeout: float) -> bool: ...
    def collect(self, chunk: Chunk) -> Lines: ...
    def cancel(self, chunk: Chunk | None) -> None: ...


class RowRunner(Runner, Protocol):
    """A runner whose rows are committed as they finish, each submitted alone and
    resumable from tokens an earlier attempt generated (workers/shards/rows.py)."""

    commits_rows: bool

    def submit(self, rows: list[dict[str, Any]], prio: int,
               resume: list[int] | None = None) -> Chunk: ...


@dataclass
class Chunk:
    rows: list[dict[str, Any]]
    # (custom_id, parsed body or the error that refused it, engine handle, input tokens)
    requests: list[tuple[str, Any, Any, int]]
    seconds: float = 0.0  # accelerator-seconds of the ok lines, set by collect
    # "custom_id: error" of the lines that failed on the server's side, set by collect
    faults: list[str] = field(default_factory=list)
    # A generation row that can be resumed: the tokens it generated so far, cut where
    # their text ends a character (what the next attempt may continue after)
    progress: Callable[[], list[int]] | None = None


def _refused(custom_id: str, e: InferqError) -> bytes:
    """A request refused before it ran, with the status a direct call would get (400 for
    a body the model cannot take, 503 for a model this worker does not hold)."""
    return outputs.error_response_line(custom_id, e.status, e.message, e.code or
                                       "invalid_request", e.type, e.param)


def _failed(chunk: Chunk, custom_id: str, e: Exception) -> bytes:
    """The error line of a request that failed in the engine: with its status (400 for
    an input the model cannot compute, 413 for one too large to fit); a server-side
    failure (5xx) is also noted in the chunk's ``faults``."""
    status, err = failure(e)
    if status >= 500:
        chunk.faults.append(f"{custom_id}: {err['message']}")
    return outputs.error_response_line(custom_id, status, err["message"], err["code"],
                                       err["type"])


class EmbeddingRunner:
    """``embedder(model)`` returns the resident version that serves the batch's rows of
    ``model`` (its engine and inputs) or refuses a model this worker does not hold."""

    def __init__(self, embedder: Callable[[str], Any], max_inputs: int) -> None:
        self.embedder, self.max_inputs = embedder, max_inputs

    def submit(self, rows: list[dict[str, Any]], prio: int) -> Chunk:
        reqs: list[tuple[str, Any, Any, int]] = []
        for r in rows:
            try:
                body = parse_embeddings(orjson.loads(r["body"]), self.max_inputs)
                res = self.embedder(body.model)
                ids = res.inputs.prepare(body)  # refuses what the model cannot serve
            except InferqError as e:
                reqs.append((r["custom_id"], e, [], 0))
                continue
            reqs.append((r["custom_id"], body, res.engine.submit(ids, prio),
                         sum(map(len, ids))))
        return Chunk(rows, reqs)

    def done(self, chunk: Chunk, timeout: float) -> bool:
        """Whether every row of ``chunk`` is computed, waiting up to ``timeout``."""
        pending = [f for _, body, futures, _ in chunk.requests
                   if not isinstance(body, InferqError) for f in futures]
        return not futures_wait(pending, timeout).not_done

    def collect(self, chunk: Chunk) -> Lines:
        ok, err, tokens, seconds = [], [], 0, 0.0
        for custom_id, body, futures, ntok in chunk.requests:
            if isinstance(body, InferqError):
                err.append(_refused(custom_id, body))
                continue
            try:
                vectors = [f.result() for f in futures]
            except Exception as e:  # noqa: BLE001 - delivered as the request's error line
                err.append(_failed(chunk, custom_id, e))
                continue
            ok.append(outputs.ok_line(custom_id, embeddings_body(body, vectors, ntok)))
            tokens += ntok
            seconds += seconds_of(futures)
        chunk.seconds = seconds
        return b"".join(ok), b"".join(err), len(ok), len(err), Tokens(tokens)

    def cancel(self, chunk: Chunk | None) -> None:
        for _, _, futures, _ in chunk.requests if chunk else []:
            for f in futures:
                f.cancel()


class GenerationRunner:
    """``chat(model)`` returns the generation engine for ``model`` (loading it on first
    use) or refuses a model this worker does not hold. Its rows are committed as they
    finish (workers/shards/rows.py): the pipeline submits each row as a chunk of one."""

    commits_rows = True

    def __init__(self, chat: Callable[[str], Engine], endpoint: str) -> None:
        self.chat, self.endpoint = chat, endpoint

    def request(self, engine: Engine, body: dict[str, Any]) -> GenRequest:
        """What the engine runs for one row's body."""
        return build_request(engine.model, self.endpoint, body)

    def answer(self, body: dict[str, Any], c: Collect) -> dict[str, Any]:
        """The body of one row's output line, from what its sequence collected."""
        u = c.usage  # every choice's tokens (best_of's included), the prompt once
        return generation_body(self.endpoint, body["model"], c.choices,
                               top_count(self.endpoint, body), u.prompt_tokens,
                               u.completion_tokens, tools_of(body))

    def submit(self, rows: list[dict[str, Any]], prio: int,
               resume: list[int] | None = None) -> Chunk:
        """``resume``: the tokens an earlier attempt generated for the one row of
        ``rows`` (jobs/batches/resume.py), continued after where its request allows."""
        reqs: list[tuple[str, Any, Any, int]] = []
        progress = None
        for r in rows:
            body = orjson.loads(r["body"])
            try:
                gen = self.chat(body["model"])
                greq = self.request(gen, body)
            except InferqError as e:
                reqs.append((r["custom_id"], e, None, 0))
                continue
            sink = Collect()
            if greq.resumable() and len(rows) == 1:
                if resume and len(resume) < greq.max_new_tokens:
                    greq.resume = list(resume)
                progress = partial(_whole_characters, gen.model, sink)
            gen.submit(greq, sink, prio)
            reqs.append((r["custom_id"], body, sink, 0))
        return Chunk(rows, reqs, progress=progress)

    def done(self, chunk: Chunk, timeout: float) -> bool:
        """Whether every row of ``chunk`` has its answer, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        return all(sink is None or sink.event.wait(max(0.0, deadline - time.monotonic()))
                   for _, _, sink, _ in chunk.requests)

    def collect(self, chunk: Chunk) -> Lines:
        ok, err, tokens, seconds = [], [], Tokens(), 0.0
        for custom_id, body, sink, _ in chunk.requests:
            if isinstance(body, InferqError):
                err.append(_refused(custom_id, body))
                continue
            try:
                c = sink.result()
            except Exception as e:  # noqa: BLE001
                err.append(_failed(chunk, custom_id, e))
                continue
            ok.append(outputs.ok_line(custom_id, self.answer(body, c)))
            tokens = tokens.plus(Tokens(c.usage.prompt_tokens, c.usage.completion_tokens))
            seconds += c.usage.accelerator_s
        chunk.seconds = seconds
        return b"".join(ok), b"".join(err), len(ok), len(err), tokens

    def cancel(self, chunk: Chunk | None) -> None:
        for _, _, sink, _ in chunk.requests if chunk else []:
            if sink is not None:
                sink.cancel()


def _whole_characters(model: Any, sink: Collect) -> list[int]:
    """The tokens ``sink``'s sequence generated so far, less the last ones where they end
    inside a character (a multi-byte character split across tokens): what a resumed
    row's text starts with must be text that an uninterrupted run would also write."""
    ids = sink.generated()
    for _ in range(4):  # a character is at most 4 bytes, each token at least 1
        if not ids or not model.decode(ids[-8:]).endswith("\ufffd"):
            return ids
        ids = ids[:-1]
    return []


class ResponsesRunner(GenerationRunner):
    """Rows of a /v1/responses batch: each runs as its chat request
    (jobs.protocol.responses_request.as_chat) and its output line's body is the Response object."""

    def request(self, engine: Engine, body: dict[str, Any]) -> GenRequest:
        return build_request(engine.model, *as_chat(self.endpoint, body))

    def answer(self, body: dict[str, Any], c: Collect) -> dict[str, Any]:
        u = c.usage
        return response_object(body, c.text, c.reason, u.prompt_tokens, u.completion_tokens)

