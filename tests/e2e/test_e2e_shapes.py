"""Every batch shape finishes: JSONL and Parquet inputs x embeddings, chat and
completions, each with every custom_id exactly once and the batch's usage equal to
the sum of its lines' usage. Finalize never leaves a batch stuck: a finalize that
cannot succeed fails the batch once, with the reason."""

from __future__ import annotations

import io
import json
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.batches import finalize, outputs
from jobs.core import errors
from jobs.core.context import Context
from jobs.core.schema import Batch, File, new_id
from jobs.core.status import BatchStatus, ShardStatus
from jobs.protocol.objects.inference import ChatCompletion, Completion
from storage import keys
from tests.factories import batch_rows
from tests.helpers import jsonl, lines, upload, wait

CHAT_MODEL = "SmolLM2-135M-Instruct"
EMB_MODEL = "all-MiniLM-L6-v2"
URL = {"embeddings": "/v1/embeddings", "chat": "/v1/chat/completions",
       "completions": "/v1/completions"}
N = 3  # requests per batch: generation runs on two CPU cores
SAMPLING = {"max_tokens": 4, "temperature": 0}
TEXTS = ["What is the capital of France?", "Name a colour.", "Count to three."]


# Finalize, on batches laid out by hand (no workers needed) ------------------------------

def make_batch(ctx: Context, endpoint: str, parts: list[bytes], fmt: str = "parquet",
               rows: int = 2) -> str:
    """A batch whose one shard is done, with ``parts`` as its committed ok parts."""
    batch_id = new_id("batch_")
    batch_rows(ctx, [{"rows": rows, "object_key": keys.shard_input(batch_id, 0),
                      "status": ShardStatus.DONE, "chunks_done": len(parts),
                      "rows_done": rows, "completed": rows}],
               id=batch_id, file_format=fmt, file_key="files/none", endpoint=endpoint,
               total=rows, model=CHAT_MODEL, expires_at=None)
    for chunk, data in enumerate(parts):
        ctx.store.put_bytes(keys.output_part(batch_id, 0, chunk, "ok"), data)
        ctx.store.put_bytes(keys.output_part(batch_id, 0, chunk, "err"), b"")
    return batch_id


def batch_row(ctx: Context, batch_id: str) -> dict[str, Any]:
    with ctx.db.session() as s:
        b = s.get(Batch, batch_id)
        assert b is not None
        return {"status": b.status, "errors": b.errors, "output_file_id": b.output_file_id}


@pytest.mark.parametrize("endpoint", [URL["chat"], URL["completions"]])
def test_parquet_generation_batch_finalizes_with_its_own_columns(ctx: Context,
                                                                 endpoint: str) -> None:
    build = ChatCompletion if endpoint == URL["chat"] else Completion
    part = (outputs.ok_line("a", build.of_text(CHAT_MODEL, "Paris.", "stop", 11, 3).body())
            + outputs.ok_line("b", build.of_text(CHAT_MODEL, "Blue", "length", 7, 4).body()))
    batch_id = make_batch(ctx, endpoint, [part])
    finalize.finalize_batch(ctx, batch_id)
    b = batch_row(ctx, batch_id)
    assert b["status"] == BatchStatus.COMPLETED, b
    with ctx.db.session() as s:
        f = s.get(File, b["output_file_id"])
        assert f is not None and f.format == "parquet"
        key = f.object_key
    with ctx.store.open(key) as fh:
        out = pq.read_table(io.BytesIO(fh.read()))
    assert out.column_names == ["custom_id", "status_code", "content", "finish_reason",
                                "tool_calls", "prompt_tokens", "completion_tokens",
                                "error_code", "error_message"]
    assert out.to_pylist()[0] == {"custom_id": "a", "status_code": 200, "content": "Paris.",
                                  "finish_reason": "stop", "tool_calls": None,
                                  "prompt_tokens": 11, "completion_tokens": 3,
                                  "error_code": None,
                                  "error_message": None}


def test_finalize_that_cannot_succeed_fails_the_batch_once(ctx: Context) -> None:
    good = outputs.ok_line("a", ChatCompletion.of_text(CHAT_MODEL, "x", "stop", 1, 1).body())
    batch_id = make_batch(ctx, URL["chat"], [good, b'{"custom_id": "b", "response": \n'])
    finalize.finalize_batch(ctx, batch_id)  # returns: the batch ends, nothing to retry
    b = batch_row(ctx, batch_id)
    assert b["status"] == BatchStatus.FAILED and b["output_file_id"] is None
    assert [e["code"] for e in b["errors"]] == ["finalize_failed"]
    assert "could not be assembled" in b["errors"][0]["message"]
    finalize.finalize_batch(ctx, batch_id)  # a resent finalize finds it terminal
    assert batch_row(ctx, batch_id) == b


def test_transient_errors_are_told_apart_from_deterministic_ones() -> None:
    import redis
    from botocore.exceptions import ClientError
    from botocore.exceptions import ConnectionError as StoreConnectionError
    from sqlalchemy.exc import DataError, OperationalError

    def s3_error(status: int) -> ClientError:
        return ClientError({"Error": {"Code": str(status)},
                            "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    # validate, finalize and the Celery tasks' retries judge by one list
    assert finalize.transient is errors.transient
    for e in (OperationalError("SELECT 1", {}, Exception("down")), ConnectionError("reset"),
              redis.ConnectionError("down"), StoreConnectionError(error="refused"),
              s3_error(503), s3_error(429)):
        assert errors.transient(e), e
    for e in (KeyError("data"), ValueError("bad line"), s3_error(404), s3_error(403),
              DataError("INSERT", {}, Exception("NUL"))):
        assert not errors.transient(e), e


# End to end, through the SDK and real workers ------------------------------------------

def body(kind: str, i: int) -> dict[str, Any]:
    if kind == "embeddings":
        return {"model": EMB_MODEL, "input": f"{TEXTS[i]} number {i}"}
    if kind == "chat":
        return {"model": CHAT_MODEL, **SAMPLING,
                "messages": [{"role": "user", "content": TEXTS[i]}]}
    return {"model": CHAT_MODEL, **SAMPLING, "prompt": TEXTS[i]}


def parquet_input(kind: str, messages_as_json: bool = False) -> bytes:
    ids = [f"r{i}" for i in range(N)]
    if kind == "embeddings":
        cols: dict[str, Any] = {"input": [body(kind, i)["input"] for i in range(N)]}
    elif kind == "completions":
        cols = {"prompt": TEXTS[:N]}
    elif messages_as_json:
        cols = {"messages": [json.dumps([{"role": "user", "content": t}]) for t in TEXTS]}
    else:
        cols = {"messages": [[{"role": "user", "content": t}] for t in TEXTS]}
    buf = io.BytesIO()
    pq.write_table(pa.table({"custom_id": ids, **cols}), buf)
    return buf.getvalue()


def usage_of_lines(kind: str, fmt: str, rows: list[dict[str, Any]]) -> tuple[int, int]:
    if fmt == "parquet":
        prompt = sum(r["prompt_tokens"] or 0 for r in rows)
        completion = sum((r.get("completion_tokens") or 0) for r in rows)
        return prompt, completion
    tokens = [outputs.line_tokens(r) for r in rows]
    return sum(t.prompt for t in tokens), sum(t.completion for t in tokens)


def results(sdk: Any, fmt: str, file_id: str | None) -> list[dict[str, Any]]:
    if fmt == "jsonl":
        return lines(sdk, file_id)
    if file_id is None:
        return []
    return pq.read_table(io.BytesIO(sdk.files.content(file_id).read())).to_pylist()


@pytest.mark.slow
@pytest.mark.parametrize("fmt,kind", [
    ("jsonl", "embeddings"), ("jsonl", "chat"), ("jsonl", "completions"),
    ("parquet", "embeddings"), ("parquet", "chat"), ("parquet", "chat-json"),
    ("parquet", "completions"),
])
def test_every_batch_shape_finishes_with_usage_of_its_lines(sdk, fmt: str, kind: str) -> None:  # type: ignore[no-untyped-def]
    endpoint_kind = "chat" if kind == "chat-json" else kind
    url = URL[endpoint_kind]
    if fmt == "jsonl":
        data = jsonl([{"custom_id": f"r{i}", "method": "POST", "url": url,
                       "body": body(endpoint_kind, i)} for i in range(N)])
        f, extra = upload(sdk, data), {}
    else:
        f = upload(sdk, parquet_input(endpoint_kind, kind == "chat-json"), "data.parquet")
        defaults = {"model": EMB_MODEL} if kind == "embeddings" else \
            {"model": CHAT_MODEL, **SAMPLING}
        extra = {"extra_body": {"body": defaults}}
    b = sdk.batches.create(input_file_id=f.id, endpoint=url, completion_window="24h",
                           **extra)
    assert b.service_tier == "default"
    b = wait(sdk, b.id)
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == \
        (N, N, 0)
    out = results(sdk, fmt, b.output_file_id)
    err = results(sdk, fmt, b.error_file_id)
    ids = Counter(r["custom_id"] for r in out + err)
    assert ids == Counter(f"r{i}" for i in range(N))
    prompt, completion = usage_of_lines(endpoint_kind, fmt, out)
    assert b.usage is not None
    assert (b.usage.input_tokens, b.usage.output_tokens, b.usage.total_tokens) == \
        (prompt, completion, prompt + completion)
    assert prompt > 0
    if endpoint_kind == "embeddings":
        assert completion == 0
    else:
        assert 0 < completion <= N * SAMPLING["max_tokens"]
    if fmt == "parquet" and endpoint_kind != "embeddings":
        assert all(r["content"] is not None and r["finish_reason"] for r in out)
