"""Parameters inferq does not implement, through the real HTTP API with the openai SDK
(strict response validation): each is a 400 naming it (``param``, code
``unsupported_parameter``; a name no endpoint has ``unknown_parameter``) on
/v1/chat/completions, /v1/completions, /v1/embeddings and /v1/jobs, and on POST
/v1/batches for the batch's ``body`` defaults; a batch line that carries one ends in the
batch's error file while the other lines compute (one embeddings worker). The API and
the control worker are the ``fstack`` of tests/integration/conftest.py."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.helpers import emb_line, jsonl, lines, upload, wait

pytestmark = pytest.mark.slow

EMB_MODEL, CHAT_MODEL = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
MSGS: Any = [{"role": "user", "content": "hi"}]


def refused(call: Callable[[], Any], param: str, code: str = "unsupported_parameter") -> str:
    """The 400 that ``call`` is answered with names ``param``; its message."""
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert e.value.status_code == 400
    err = e.value.body
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, err
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code)
    assert (e.value.param, e.value.code) == (param, code)
    assert err["message"].startswith(f"{param}: "), err
    return str(err["message"])


def test_chat_completions_refuse_what_they_do_not_implement(fsdk) -> None:  # type: ignore[no-untyped-def]
    chat = fsdk.chat.completions.create
    message = refused(lambda: chat(model=CHAT_MODEL, messages=MSGS, store=True), "store")
    assert "completions are not stored" in message
    unenforceable = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "$ref": "#/nowhere"}}}
    with pytest.raises(openai.BadRequestError) as bad:
        chat(model=CHAT_MODEL, messages=MSGS, response_format=unenforceable)
    assert bad.value.param == "response_format" and "cannot be enforced" in bad.value.message
    refused(lambda: chat(model=CHAT_MODEL, messages=MSGS, tools=[
        {"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools")
    refused(lambda: chat(model=CHAT_MODEL, messages=MSGS, metadata={"k": "v"}), "metadata")
    refused(lambda: chat(model=CHAT_MODEL, messages=MSGS, stream=True,
                         audio={"voice": "alloy", "format": "mp3"}),
            "audio")  # a stream is refused before it starts
    refused(lambda: chat(model=CHAT_MODEL, messages=[
        {"role": "user", "content": [{"type": "image_url",
                                      "image_url": {"url": "https://x.invalid/a.png"}}]}]),
        "messages.0.content.0.type")
    refused(lambda: chat(model=CHAT_MODEL, messages=[
        *MSGS, {"role": "tool", "content": "4", "tool_call_id": "call_1"}]),
        "tools")  # the model's chat template does not render tools
    refused(lambda: chat(model=CHAT_MODEL, messages=MSGS, extra_body={"top_k": 5}), "top_k",
            "unknown_parameter")


def test_completions_and_embeddings_refuse_them_too(fsdk) -> None:  # type: ignore[no-untyped-def]
    complete = fsdk.completions.create
    refused(lambda: complete(model=CHAT_MODEL, prompt="Once", suffix="."), "suffix")
    refused(lambda: complete(model=CHAT_MODEL, prompt="Once",
                             extra_body={"max_completion_tokens": 4}),
            "max_completion_tokens", "unknown_parameter")
    refused(lambda: fsdk.embeddings.create(model=EMB_MODEL, input="hi",
                                           extra_body={"normalize": False}),
            "normalize", "unknown_parameter")


def test_jobs_refuse_them_in_their_body(fsdk) -> None:  # type: ignore[no-untyped-def]
    def job(endpoint: str, body: dict[str, Any]) -> Callable[[], Any]:
        return lambda: fsdk.post("/jobs", cast_to=object,
                                 body={"endpoint": endpoint, "body": body})

    refused(job("/v1/chat/completions", {"model": CHAT_MODEL, "messages": MSGS,
                                         "store": True}), "store")
    refused(job("/v1/completions", {"model": CHAT_MODEL, "prompt": "Once", "suffix": "!"}),
            "suffix")
    refused(job("/v1/embeddings", {"model": EMB_MODEL, "input": "hi", "truncate": True}),
            "truncate", "unknown_parameter")
    # at the value that does nothing it is taken (the job is stored; no worker needed)
    ok = fsdk.post("/jobs", cast_to=object, body={"endpoint": "/v1/chat/completions", "body": {
        "model": CHAT_MODEL, "messages": MSGS, "max_tokens": 2, "logprobs": False,
        "presence_penalty": 0, "n": 1, "store": False, "tools": None}})
    assert ok["object"] == "job"


def test_a_batch_refuses_defaults_it_could_not_take(fsdk) -> None:  # type: ignore[no-untyped-def]
    f = upload(fsdk, jsonl([emb_line(0, "x")]))
    refused(lambda: fsdk.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
        extra_body={"body": {"model": CHAT_MODEL, "store": True}}), "body.store")
    refused(lambda: fsdk.batches.create(
        input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h",
        extra_body={"body": {"model": EMB_MODEL, "temperature": 0}}), "body.temperature",
        "unknown_parameter")
    # every line would be refused: a model not trained for shortened vectors
    msg = refused(lambda: fsdk.batches.create(
        input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h",
        extra_body={"body": {"model": EMB_MODEL, "dimensions": 32}}), "body.dimensions")
    assert "not trained for shortened vectors" in msg


def test_batch_lines_with_them_end_in_the_error_file(fsdk, workers) -> None:  # type: ignore[no-untyped-def]
    """JSONL lines that name no model take the batch's ``body.model``; lines with a
    parameter inferq does not take are error lines; the others are computed."""
    workers("params")

    def line(i: str, **body: Any) -> dict[str, Any]:
        return {"custom_id": i, "method": "POST", "url": "/v1/embeddings", "body": body}

    rows = [emb_line("own-model", "a cat sits on the mat"),
            line("default-model", input="a kitten rests on a rug"),
            line("with-user", input="the stock market fell", user="u"),
            line("typo", input="x", dimension=8), line("extra", input="x", normalize=False)]
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h",
                            extra_body={"body": {"model": EMB_MODEL,
                                                 "encoding_format": "base64"}})
    b = wait(fsdk, b.id)
    assert b.status == "completed", b
    assert b.request_counts is not None
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == \
        (5, 3, 2)
    out = {x["custom_id"]: x for x in lines(fsdk, b.output_file_id)}
    assert set(out) == {"req-own-model", "default-model", "with-user"}
    for x in out.values():
        body = x["response"]["body"]
        assert body["model"] == EMB_MODEL  # base64 from the defaults: 384 float32 values
        assert len(base64.b64decode(body["data"][0]["embedding"])) == 384 * 4
    errs = {x["custom_id"]: x["response"] for x in lines(fsdk, b.error_file_id)}
    assert {k: (r["status_code"], r["body"]["error"]["param"], r["body"]["error"]["code"])
            for k, r in errs.items()} == {"typo": (400, "dimension", "unknown_parameter"),
                                         "extra": (400, "normalize", "unknown_parameter")}

    # a chat batch whose every line carries one: judged in validation, no worker needed
    def chat(i: str, **params: Any) -> dict[str, Any]:
        return {"custom_id": i, "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": CHAT_MODEL, "messages": MSGS, **params}}

    rows = [chat("json", response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"$ref": "#/nowhere"}}}),
            chat("store", store=True),
            chat("tools", tools=[{"type": "function", "function": {"name": "f"}}],
                 tool_choice="auto"),
            chat("metadata", metadata={"k": "v"})]
    b = wait(fsdk, fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                                       endpoint="/v1/chat/completions",
                                       completion_window="24h").id)
    assert b.status == "completed" and b.output_file_id is None, b
    assert b.request_counts is not None and b.request_counts.failed == 4
    errs = {x["custom_id"]: x["response"]["body"]["error"] for x in lines(fsdk, b.error_file_id)}
    assert {k: (e["param"], e["code"]) for k, e in errs.items()} == {
        "json": ("response_format", "invalid_request"),
        "store": ("store", "unsupported_parameter"),
        "tools": ("tools", "unsupported_parameter"),
        "metadata": ("metadata", "unsupported_parameter")}
