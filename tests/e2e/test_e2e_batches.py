"""The main job end to end: the openai SDK (strict validation) against the real API,
a real Celery control worker and model worker, PostgreSQL, Redis and moto's S3."""

from __future__ import annotations

import base64
import io
from collections import Counter

import numpy as np
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import emb_line, jsonl, lines, served, upload, wait

pytestmark = pytest.mark.slow

SENTENCES = ["a cat sits on the mat", "a kitten rests on a rug", "the stock market fell"]


def test_batch_roundtrip_with_openai_sdk(sdk) -> None:  # type: ignore[no-untyped-def]
    rows = [emb_line(i, s) for i, s in enumerate(SENTENCES)]
    rows += [emb_line(i, f"filler text number {i} " * (1 + i % 17)) for i in range(3, 1000)]
    f = upload(sdk, jsonl(rows))
    assert f.purpose == "batch" and f.bytes > 0
    b = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h", metadata={"team": "search"})
    assert b.status == "validating"
    b = wait(sdk, b.id)
    assert b.status == "completed", b
    assert b.request_counts is not None
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == \
        (1000, 1000, 0)
    assert b.metadata == {"team": "search"} and b.error_file_id is None
    assert b.service_tier == "default"
    out = lines(sdk, b.output_file_id)
    prompt = sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in out)
    assert b.usage is not None
    assert (b.usage.input_tokens, b.usage.output_tokens, b.usage.total_tokens) == \
        (prompt, 0, prompt)
    counts = Counter(line["custom_id"] for line in out)
    assert set(counts) == {r["custom_id"] for r in rows} and set(counts.values()) == {1}
    by_id = {line["custom_id"]: line for line in out}
    first = by_id["req-0"]
    assert first["error"] is None and first["response"]["status_code"] == 200
    body = first["response"]["body"]
    assert body["object"] == "list" and body["model"] == "all-MiniLM-L6-v2"
    assert body["usage"]["prompt_tokens"] > 0
    vec = {i: np.array(by_id[f"req-{i}"]["response"]["body"]["data"][0]["embedding"])
           for i in range(3)}
    assert all(v.shape == (384,) for v in vec.values())
    assert float(vec[0] @ vec[1]) > float(vec[0] @ vec[2]) + 0.2


def test_sync_embeddings_float_and_base64(sdk, shortening) -> None:  # type: ignore[no-untyped-def]
    r = sdk.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES,
                              encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2] and len(r.data[0].embedding) == 384
    assert r.usage.prompt_tokens > 0
    # By default the SDK asks for base64 and decodes it itself. Its strict mode validates
    # before decoding (and would reject the hosted API alike), as docs/API.md says: in
    # strict mode embeddings take encoding_format="float"; the default call is not strict.
    with pytest.raises(openai.APIResponseValidationError):
        sdk.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES)
    from openai import OpenAI

    lenient = OpenAI(base_url=str(sdk.base_url), api_key=sdk.api_key, max_retries=0)
    r64 = lenient.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES)
    v = np.array([d.embedding for d in r64.data])
    assert np.allclose(v, np.array([d.embedding for d in r.data]), atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2]
    raw = sdk.embeddings.with_raw_response.create(model="all-MiniLM-L6-v2", input="x",
                                                  encoding_format="base64").http_response.json()
    assert len(base64.b64decode(raw["data"][0]["embedding"])) == 384 * 4
    # shortened vectors: from a model registered as trained for them; refused for MiniLM
    short = served(lambda: sdk.embeddings.create(model=shortening, input="x", dimensions=64,
                                                 encoding_format="float"))
    assert len(short.data[0].embedding) == 64
    assert abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-4
    with pytest.raises(openai.BadRequestError) as e:
        sdk.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=64)
    assert e.value.param == "dimensions" and e.value.code == "unsupported_parameter"


def test_parquet_dataset_in_parquet_out(sdk) -> None:  # type: ignore[no-untyped-def]
    table = pa.table({"custom_id": [f"p{i}" for i in range(50)],
                      "input": [f"row {i} about cats" if i != 7 else None for i in range(50)]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    f = upload(sdk, buf.getvalue(), "data.parquet")
    b = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h",
                           extra_body={"body": {"model": "all-MiniLM-L6-v2"}})
    b = wait(sdk, b.id)
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == \
        (50, 49, 1)
    out = pq.read_table(io.BytesIO(sdk.files.content(b.output_file_id).read()))
    assert out.column_names == ["custom_id", "status_code", "embedding", "prompt_tokens",
                                "error_code", "error_message"]
    assert sorted(out.column("custom_id").to_pylist()) == \
        sorted(f"p{i}" for i in range(50) if i != 7)
    assert {len(v) for v in out.column("embedding").to_pylist()} == {384}
    assert set(out.column("status_code").to_pylist()) == {200}
    err = pq.read_table(io.BytesIO(sdk.files.content(b.error_file_id).read())).to_pylist()
    assert [(e["custom_id"], e["status_code"]) for e in err] == [("p7", 400)]
    assert err[0]["embedding"] is None and err[0]["error_message"]


def test_per_request_errors_go_to_error_file(sdk) -> None:  # type: ignore[no-untyped-def]
    rows = [emb_line(i, f"good {i}") for i in range(20)]
    rows.append({"custom_id": "bad-empty", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": "all-MiniLM-L6-v2", "input": ""}})
    rows.append({"custom_id": "bad-type", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": "all-MiniLM-L6-v2", "input": {"x": 1}}})
    b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                           endpoint="/v1/embeddings", completion_window="24h")
    b = wait(sdk, b.id)
    assert b.status == "completed"
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == \
        (22, 20, 2)
    err_lines = lines(sdk, b.error_file_id)
    errs = {x["custom_id"]: x for x in err_lines}
    assert set(errs) == {"bad-empty", "bad-type"}
    assert errs["bad-empty"]["response"]["status_code"] == 400
    assert errs["bad-empty"]["response"]["body"]["error"]["message"]
    out = lines(sdk, b.output_file_id)
    assert len(out) == 20
    seen = Counter(x["custom_id"] for x in out + err_lines)
    assert set(seen) == {r["custom_id"] for r in rows} and set(seen.values()) == {1}


@pytest.mark.parametrize("case", ["malformed", "duplicate", "wrong_url", "unknown_model",
                                  "non_utf8", "huge_line"])
def test_whole_file_problems_fail_with_line_numbers(sdk, case: str) -> None:  # type: ignore[no-untyped-def]
    good = [jsonl([emb_line(i, f"text {i}")]) for i in range(5)]
    bad = {
        "malformed": (b'{"custom_id": "x", "method": "POST", \n', "invalid_json_line"),
        "duplicate": (jsonl([emb_line(1, "again")]), "duplicate_custom_id"),
        "wrong_url": (jsonl([emb_line("u", "t", url="/v1/chat/completions")]), "invalid_url"),
        "unknown_model": (jsonl([emb_line("m", "t", model="no-such-model")]),
                          "model_not_found"),
        "non_utf8": (b'{"custom_id": "\xff\xfe", "url": "/v1/embeddings"}\n', "invalid_encoding"),
        "huge_line": (jsonl([emb_line("h", "word " * 1_200_000)]), "line_too_long"),
    }[case]
    data = b"".join(good[:3]) + bad[0] + b"".join(good[3:])
    b = sdk.batches.create(input_file_id=upload(sdk, data).id, endpoint="/v1/embeddings",
                           completion_window="24h")
    b = wait(sdk, b.id)
    assert b.status == "failed" and b.failed_at is not None
    assert b.errors is not None and b.errors.data
    err = b.errors.data[0]
    assert (err.code, err.line) == (bad[1], 4), err
    assert b.output_file_id is None


def test_cancel_keeps_finished_results_and_loses_nothing(sdk) -> None:  # type: ignore[no-untyped-def]
    rows = [emb_line(i, f"a somewhat longer sentence number {i} " * 4) for i in range(3000)]
    b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                           endpoint="/v1/embeddings", completion_window="24h")
    wait(sdk, b.id, until=("in_progress", "completed"))
    c = sdk.batches.cancel(b.id)
    assert c.status in ("cancelling", "cancelled", "completed")
    b = wait(sdk, b.id)
    assert b.status in ("cancelled", "completed")
    out = lines(sdk, b.output_file_id)
    err = lines(sdk, b.error_file_id)
    ids = Counter(x["custom_id"] for x in out + err)
    assert set(ids) == {r["custom_id"] for r in rows} and set(ids.values()) == {1}
    if b.status == "cancelled":
        assert err and all(x["error"]["code"] == "batch_cancelled" for x in err)
        assert b.request_counts.completed == len(out)


def test_list_and_paginate(sdk) -> None:  # type: ignore[no-untyped-def]
    f = upload(sdk, jsonl([emb_line(0, "x")]))
    made = [sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                               completion_window="24h").id for _ in range(3)]
    page = sdk.batches.list(limit=2)
    assert len(page.data) == 2 and page.has_more
    seen = [b.id for b in sdk.batches.list(limit=2)]  # iterating follows `after`
    assert seen[:3] == made[::-1] and len(seen) == len(set(seen))
    files = [x.id for x in sdk.files.list()]
    assert f.id in files
    for bid in made:
        wait(sdk, bid)


def test_file_retrieve_content_delete(sdk) -> None:  # type: ignore[no-untyped-def]
    data = jsonl([emb_line(0, "hello")])
    f = upload(sdk, data)
    assert sdk.files.retrieve(f.id).bytes == len(data)
    assert sdk.files.content(f.id).read() == data
    d = sdk.files.delete(f.id)
    assert d.deleted and d.id == f.id
    with pytest.raises(Exception) as e:
        sdk.files.retrieve(f.id)
    assert getattr(e.value, "status_code", None) == 404


def test_bad_batches_do_not_disturb_good_ones(sdk) -> None:  # type: ignore[no-untyped-def]
    good_rows = [emb_line(i, f"good text {i}") for i in range(300)]
    good = sdk.batches.create(input_file_id=upload(sdk, jsonl(good_rows)).id,
                              endpoint="/v1/embeddings", completion_window="24h")
    bad_files = [b"not json at all\n", jsonl([emb_line(0, "a"), emb_line(0, "b")]),
                 b"\xff\xfe\xfd\n"]
    bad = [sdk.batches.create(input_file_id=upload(sdk, data).id, endpoint="/v1/embeddings",
                              completion_window="24h") for data in bad_files]
    assert {wait(sdk, b.id).status for b in bad} == {"failed"}
    g = wait(sdk, good.id)
    assert g.status == "completed" and g.request_counts.completed == 300
    assert sorted(x["custom_id"] for x in lines(sdk, g.output_file_id)) == \
        sorted(r["custom_id"] for r in good_rows)
