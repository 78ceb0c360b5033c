"""Batch output lines and Parquet rows, built in one place (jobs.batches.outputs)."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq

from jobs.batches import outputs
from jobs.batches.outputs import Tokens
from jobs.protocol.objects.inference import ChatCompletion, Completion
from storage.parquet import write_rows

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


def parsed(line: bytes) -> dict:  # type: ignore[type-arg]
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    return orjson.loads(line)  # type: ignore[no-any-return]


def test_ok_and_error_lines_have_the_openai_batch_output_shape() -> None:
    ok = parsed(outputs.ok_line("a", {"x": 1}))
    assert ok["custom_id"] == "a" and ok["error"] is None and ok["id"].startswith("batch_req_")
    assert ok["response"]["status_code"] == 200 and ok["response"]["body"] == {"x": 1}
    bad = parsed(outputs.invalid_request_line("b", "input: too long", param="input"))
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"] == {"message": "input: too long",
                                                "type": "invalid_request_error",
                                                "param": "input", "code": "invalid_request"}
    unrun = parsed(outputs.unrun_line("c", "batch_cancelled", "cancelled first"))
    assert unrun["response"] is None
    assert unrun["error"] == {"code": "batch_cancelled", "message": "cancelled first"}


def test_line_tokens_counts_prompt_and_completion_apart() -> None:
    chat = parsed(outputs.ok_line("a", ChatCompletion.of_text("m", "hi", "stop", 12, 3).body()))
    assert outputs.line_tokens(chat) == Tokens(12, 3)
    emb = parsed(outputs.ok_line("b", {"data": [], "usage": {"prompt_tokens": 7,
                                                             "total_tokens": 7}}))
    assert outputs.line_tokens(emb) == Tokens(7, 0)
    err = parsed(outputs.error_response_line("c", 500, "boom", "server_error", "server_error"))
    assert outputs.line_tokens(err) == Tokens()
    assert Tokens(1, 2).plus(Tokens(3, 4)) == Tokens(4, 6)


def test_iter_lines_reassembles_lines_cut_across_blocks() -> None:
    data = outputs.ok_line("a", {"n": 1}) + outputs.unrun_line("b", "c", "m")
    blocks = [data[i: i + 7] for i in range(0, len(data), 7)]
    assert [x["custom_id"] for x in outputs.iter_lines(blocks)] == ["a", "b"]


def test_generation_rows_for_chat_and_completions(tmp_path: Path) -> None:
    lines = [
        outputs.ok_line("c1", ChatCompletion.of_text("m", "Paris", "stop", 20, 2).body()),
        outputs.error_response_line("c2", 413, "too long", "request_too_large"),
        outputs.unrun_line("c3", "batch_expired", "expired first"),
    ]
    rows = list(outputs.parquet_rows(CHAT, iter(lines)))
    assert rows[0] == {"custom_id": "c1", "status_code": 200, "content": "Paris",
                       "finish_reason": "stop", "tool_calls": None, "prompt_tokens": 20,
                       "completion_tokens": 2, "error_code": None, "error_message": None}
    assert (rows[1]["status_code"], rows[1]["error_code"], rows[1]["content"]) == \
        (413, "request_too_large", None)
    assert (rows[2]["status_code"], rows[2]["error_code"]) == (None, "batch_expired")
    path = tmp_path / "out.parquet"
    assert write_rows(path, outputs.parquet_schema(CHAT), iter(rows)) == 3
    assert pq.read_table(path).to_pylist() == rows

    text = outputs.ok_line("t1", Completion.of_text("m", " 5, 6", "length", 9, 4).body())
    row = outputs.parquet_row(COMPLETIONS, parsed(text))
    assert (row["content"], row["finish_reason"], row["completion_tokens"]) == \
        (" 5, 6", "length", 4)


def test_embedding_rows_keep_their_columns_and_decode_base64() -> None:
    assert outputs.parquet_schema(EMBEDDINGS).names == [
        "custom_id", "status_code", "embedding", "prompt_tokens", "error_code", "error_message"]
    v = np.array([0.5, -1.0, 2.0], dtype="<f4")
    for emb in ([0.5, -1.0, 2.0], base64.b64encode(v.tobytes()).decode()):
        body = {"object": "list", "data": [{"index": 0, "embedding": emb}],
                "usage": {"prompt_tokens": 3, "total_tokens": 3}}
        row = outputs.parquet_row(EMBEDDINGS, parsed(outputs.ok_line("e", body)))
        assert row["embedding"] == [0.5, -1.0, 2.0] and row["prompt_tokens"] == 3


def test_a_row_is_built_from_any_line_without_raising() -> None:
    for line in ({"custom_id": "x", "response": {"status_code": 200, "body": {}}},
                 {"custom_id": "y", "response": {"status_code": 200, "body": None}},
                 {"custom_id": "z", "response": None, "error": None}):
        for endpoint in (EMBEDDINGS, CHAT):
            row = outputs.parquet_row(endpoint, line)
            assert row["custom_id"] == line["custom_id"]
