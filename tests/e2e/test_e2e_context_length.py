"""An embeddings input longer than the model's context is refused with 400, never
silently truncated: on the synchronous call (answered by a worker over the realtime
lane) and as the error line of its request in a batch (the rest of the batch runs).
So is asking for more ``dimensions`` than a model serving them produces: the worker,
which knows the model's size, refuses it; a model not trained for shortened vectors
takes no ``dimensions`` at all."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.helpers import emb_line, jsonl, lines, served, upload, wait

MODEL = "all-MiniLM-L6-v2"  # a 256-token context, 384 dimensions
LONG = "word " * 300  # 302 tokens with [CLS] and [SEP]


def test_sync_embeddings_over_the_context_is_400(sdk) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as e:
        sdk.embeddings.create(model=MODEL, input=["fits", LONG])
    assert e.value.status_code == 400
    assert e.value.code == "context_length_exceeded" and e.value.param == "input"
    assert "input[1] is 302 tokens long" in e.value.message and "256" in e.value.message
    with pytest.raises(openai.BadRequestError, match="257 tokens"):
        sdk.embeddings.create(model=MODEL, input=[7] * 255)
    ok = sdk.embeddings.create(model=MODEL, input="word " * 254,  # exactly 256 tokens
                               encoding_format="float")
    assert ok.usage.prompt_tokens == 256


def test_sync_embeddings_with_more_dimensions_than_the_model_is_400(sdk, shortening) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as e:
        served(lambda: sdk.embeddings.create(model=shortening, input="x", dimensions=1000))
    assert e.value.status_code == 400 and e.value.param == "dimensions"
    assert e.value.type == "invalid_request_error"
    assert e.value.message.endswith(f"dimensions is 1000, but {shortening} produces "
                                    "384-dimensional embeddings: ask for at most 384")
    ok = sdk.embeddings.create(model=shortening, input="x", dimensions=384,
                               encoding_format="float")
    assert len(ok.data[0].embedding) == 384
    # a model not trained for shortened vectors: refused at the door, whatever the value
    with pytest.raises(openai.BadRequestError) as e:
        sdk.embeddings.create(model=MODEL, input="x", dimensions=384)
    assert (e.value.param, e.value.code) == ("dimensions", "unsupported_parameter")


def test_batch_line_over_the_context_gets_an_error_line(sdk) -> None:  # type: ignore[no-untyped-def]
    too_wide = emb_line(3, "short three")
    too_wide["body"]["dimensions"] = 1000
    rows = [emb_line(0, "short one"), emb_line(1, LONG), emb_line(2, "short two"), too_wide]
    b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                           endpoint="/v1/embeddings", completion_window="24h")
    b = wait(sdk, b.id, timeout=180)
    assert b.status == "completed", b
    assert (b.request_counts.completed, b.request_counts.failed) == (2, 2)
    assert sorted(o["custom_id"] for o in lines(sdk, b.output_file_id)) == ["req-0", "req-2"]
    long, wide = sorted(lines(sdk, b.error_file_id), key=lambda o: o["custom_id"])
    assert long["custom_id"] == "req-1" and long["response"]["status_code"] == 400
    assert "302 tokens long" in long["response"]["body"]["error"]["message"]
    assert wide["custom_id"] == "req-3" and wide["response"]["status_code"] == 400
    assert "not trained for shortened vectors" in wide["response"]["body"]["error"]["message"]


def finished_job(sdk: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Submit an embeddings job and wait until it has ended."""
    job: dict[str, Any] = sdk.post("/jobs", cast_to=object,
                                   body={"endpoint": "/v1/embeddings", "body": body})
    deadline = time.monotonic() + 120
    while job["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
        job = sdk.get(f"/jobs/{job['id']}", cast_to=object)
    return job


def test_job_over_the_context_fails_with_the_reason(sdk) -> None:  # type: ignore[no-untyped-def]
    job = finished_job(sdk, {"model": MODEL, "input": LONG})
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "context_length_exceeded"
    assert "302 tokens long" in job["error"]["message"]


def test_job_with_more_dimensions_than_the_model_fails_with_the_reason(sdk, shortening) -> None:  # type: ignore[no-untyped-def]
    job = finished_job(sdk, {"model": shortening, "input": "x", "dimensions": 1000})
    assert job["status"] == "failed", job
    assert job["error"]["param"] == "dimensions"
    assert job["error"]["message"].startswith(f"dimensions is 1000, but {shortening}")
