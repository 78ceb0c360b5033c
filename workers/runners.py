"""Runners: how a chunk of batch rows is fed to an engine and turned into output lines.

``submit`` queues a chunk and returns at once (so the next chunk can be queued
while this one is written); ``collect`` waits for it and returns
(ok lines, error lines, completed, failed, tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from jobs import shapes
from jobs.errors import InferqError, InvalidRequest
from jobs.requests import CHAT, parse_embeddings
from workers.embedding_engine import EmbeddingEngine
from workers.generation import Collect, GenerationEngine, build_request
from workers.responses import embeddings_body, failure, http_error_line, ok_line

Lines = tuple[bytes, bytes, int, int, int]


class Runner(Protocol):
    def submit(self, rows: list[dict[str, Any]], prio: int) -> Chunk: ...
    def collect(self, chunk: Chunk) -> Lines: ...
    def cancel(self, chunk: Chunk | None) -> None: ...


@dataclass
class Chunk:
    rows: list[dict[str, Any]]
    # (custom_id, parsed body or an error message, engine handle, input tokens)
    requests: list[tuple[str, Any, Any, int]]


def _bad(custom_id: str, message: str) -> bytes:
    return http_error_line(custom_id, 400, message, "invalid_request", "invalid_request_error")


def _failed(custom_id: str, e: Exception) -> bytes:
    status, err = failure(e)
    return http_error_line(custom_id, status, err["message"], err["code"], err["type"])


class EmbeddingRunner:
    def __init__(self, engine: EmbeddingEngine, tok: Any, max_inputs: int) -> None:
        self.engine, self.tok, self.max_inputs = engine, tok, max_inputs

    def submit(self, rows: list[dict[str, Any]], prio: int) -> Chunk:
        reqs: list[tuple[str, Any, Any, int]] = []
        for r in rows:
            try:
                body = parse_embeddings(orjson.loads(r["body"]), self.max_inputs)
            except InvalidRequest as e:
                reqs.append((r["custom_id"], e.message, [], 0))
                continue
            ids = self.tok.tokenize(body.inputs())
            reqs.append((r["custom_id"], body, self.engine.submit(ids, prio),
                         sum(map(len, ids))))
        return Chunk(rows, reqs)

    def collect(self, chunk: Chunk) -> Lines:
        ok, err, tokens = [], [], 0
        for custom_id, body, futures, ntok in chunk.requests:
            if isinstance(body, str):
                err.append(_bad(custom_id, body))
                continue
            try:
                vectors = [f.result() for f in futures]
            except Exception as e:  # noqa: BLE001 - delivered as the request's error line
                err.append(_failed(custom_id, e))
                continue
            ok.append(ok_line(custom_id, embeddings_body(body, vectors, ntok)))
            tokens += ntok
        return b"".join(ok), b"".join(err), len(ok), len(err), tokens

    def cancel(self, chunk: Chunk | None) -> None:
        for _, _, futures, _ in chunk.requests if chunk else []:
            for f in futures:
                f.cancel()


class GenerationRunner:
    def __init__(self, generator: GenerationEngine, endpoint: str) -> None:
        self.generator, self.endpoint = generator, endpoint

    def submit(self, rows: list[dict[str, Any]], prio: int) -> Chunk:
        reqs: list[tuple[str, Any, Any, int]] = []
        for r in rows:
            body = orjson.loads(r["body"])
            try:
                greq = build_request(self.generator.model, self.endpoint, body)
            except InferqError as e:
                reqs.append((r["custom_id"], e.message, None, 0))
                continue
            sink = Collect()
            self.generator.submit(greq, sink, prio)
            reqs.append((r["custom_id"], body, sink, 0))
        return Chunk(rows, reqs)

    def collect(self, chunk: Chunk) -> Lines:
        ok, err, tokens = [], [], 0
        build = shapes.chat_completion if self.endpoint == CHAT else shapes.text_completion
        for custom_id, body, sink, _ in chunk.requests:
            if isinstance(body, str):
                err.append(_bad(custom_id, body))
                continue
            try:
                c = sink.result()
            except Exception as e:  # noqa: BLE001
                err.append(_failed(custom_id, e))
                continue
            u = c.usage
            ok.append(ok_line(custom_id, build(body["model"], c.text, c.reason,
                                               u.prompt_tokens, u.completion_tokens)))
            tokens += u.prompt_tokens + u.completion_tokens
        return b"".join(ok), b"".join(err), len(ok), len(err), tokens

    def cancel(self, chunk: Chunk | None) -> None:
        for _, _, sink, _ in chunk.requests if chunk else []:
            if sink is not None:
                sink.cancel()
