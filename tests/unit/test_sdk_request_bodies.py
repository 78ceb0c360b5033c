"""What the pinned ``openai`` SDK sends for its ordinary calls passes the strict request
models (jobs/protocol/embeddings.py, generation.py, responses_request.py) unchanged: the
bodies are taken at the HTTP edge, by a transport that answers in the server's place, and
parsed as the API parses them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from openai import OpenAI

from jobs.protocol.endpoints import CHAT, COMPLETIONS
from jobs.protocol.parsing import parse_embeddings, parse_generation

ANSWERS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"id": "x", "object": "chat.completion", "created": 0,
                             "model": "m", "choices": []},
    "/v1/completions": {"id": "x", "object": "text_completion", "created": 0, "model": "m",
                        "choices": []},
    "/v1/embeddings": {"object": "list", "data": [], "model": "m",
                       "usage": {"prompt_tokens": 0, "total_tokens": 0}},
}


def sent(call: Callable[[OpenAI], Any]) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of the one request ``call`` makes."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if body.get("stream"):
            return httpx2.Response(200, content=b"data: [DONE]\n\n",
                                   headers={"content-type": "text/event-stream"})
        out = ANSWERS[request.url.path]
        if request.url.path == "/v1/embeddings":  # one vector, in the format asked for
            vector = [0.0] if body.get("encoding_format") == "float" else "AAAAAA=="
            out = {**out, "data": [{"object": "embedding", "index": 0, "embedding": vector}]}
        return httpx2.Response(200, json=out)

    client = OpenAI(base_url="http://inferq.invalid/v1", api_key="k", max_retries=0,
                    http_client=httpx2.Client(transport=httpx2.MockTransport(answer)))
    result = call(client)
    if hasattr(result, "__iter__") and not isinstance(result, dict):
        list(result)  # a stream: read to its end
    assert len(seen) == 1, seen
    return seen[0]


MSGS: Any = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "Count to three."}]}]
CALLS: dict[str, Callable[[OpenAI], Any]] = {
    "chat": lambda c: c.chat.completions.create(
        model="m", messages=MSGS, temperature=0, top_p=1, max_tokens=16, seed=7, n=1,
        stop=["\n"], user="u", frequency_penalty=0, presence_penalty=0.0, logit_bias={},
        logprobs=False, store=False, tool_choice="none", response_format={"type": "text"}),
    "chat-stream": lambda c: c.chat.completions.create(
        model="m", messages=MSGS, temperature=0.7, max_completion_tokens=8, stream=True,
        stream_options={"include_usage": True}),
    "completion": lambda c: c.completions.create(model="m", prompt="Once", max_tokens=4,
                                                 temperature=1.5, stop="."),
    "completion-stream": lambda c: c.completions.create(model="m", prompt=["Once"],
                                                        max_tokens=4, stream=True),
    "embeddings": lambda c: c.embeddings.create(model="m", input="hello"),
    "embeddings-list": lambda c: c.embeddings.create(model="m", input=["a", "b"],
                                                     encoding_format="float"),
    "embeddings-ids": lambda c: c.embeddings.create(model="m", input=[[101, 7592, 102]],
                                                    dimensions=8),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_the_sdks_bodies_pass_the_strict_models(name: str) -> None:
    path, body = sent(CALLS[name])
    if path == "/v1/embeddings":
        emb = parse_embeddings(body, 2048)
        assert emb.model == "m" and emb.inputs()
        if "dimensions" in body:
            assert emb.dimensions == 8
        return
    req = parse_generation(CHAT if path == "/v1/chat/completions" else COMPLETIONS, body)
    assert req.stream is bool(body.get("stream"))
    assert isinstance(req.temperature, float)
    assert req.temperature == body.get("temperature", 1.0)
    if name == "chat":
        assert (req.max_tokens, req.seed, req.stops()) == (16, 7, ["\n"])
        # parameters sent at the value that does nothing are taken, and left out (those
        # implemented are read at it: n 1, no penalties, no bias, no log probabilities)
        assert req.model_fields_set == {"model", "messages", "temperature", "top_p",
                                        "max_tokens", "seed", "stop", "user", "n",
                                        "frequency_penalty", "presence_penalty",
                                        "logit_bias", "logprobs", "response_format",
                                        "tool_choice"}
        assert (req.n, req.frequency_penalty, req.presence_penalty, req.token_bias(),
                req.top_count()) == (1, 0.0, 0.0, {}, None)
    if name == "chat-stream":
        assert req.include_usage() and req.token_limit() == 8
