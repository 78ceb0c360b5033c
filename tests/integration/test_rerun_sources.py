"""A rerun (``POST /v1/batches/{id}/retry``) of a batch whose requests are no longer what
it ran: its input file deleted (409 ``results_expired``, as docs/API.md says), or its
dataset in place rewritten since the batch read it (409 ``source_changed``, never a 500).
Through the official SDK against the app in this process, on a database and Redis DB
of this test's own and the session's S3 server; the test is the control worker and the
batch worker (the real shard pipeline on the packaged MiniLM), with the injected
out-of-memory fault of test_reruns making the long requests fail the first time."""

from __future__ import annotations

import io
from typing import Any

import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai import OpenAI
from openai.types import Batch as BatchObject

from jobs.batches import locations
from jobs.core.settings import Settings
from tests.helpers import emb_line, jsonl, lake_world, run_in_process, world_sdk

MODEL = "all-MiniLM-L6-v2"
LONG = 10  # every 10th request is long, and fails under the fault
OOM_ABOVE = 40


@pytest.fixture
def world(own_settings: Settings, s3_endpoint: str) -> dict[str, Any]:
    return lake_world(own_settings, s3_endpoint, "rerun-sources",
                      {MODEL: ("embeddings", 256)}, shard_rows=20, chunk_rows=10)


def text(i: int) -> str:
    return ("a long request " * 20) if i % LONG == 0 else f"short {i}"


def run_with_failures(world: dict[str, Any], batch_id: str, minilm: Any,
                      engine: Any) -> None:
    minilm.fault_oom_above_tokens = OOM_ABOVE
    try:
        run_in_process(world["ctx"], batch_id, minilm, engine)
    finally:
        minilm.fault_oom_above_tokens = 0


def retry_refused(client: OpenAI, batch_id: str) -> dict[str, Any]:
    with pytest.raises(openai.ConflictError) as e:
        client.post(f"/batches/{batch_id}/retry", body={}, cast_to=BatchObject)
    assert e.value.response.headers["x-should-retry"] == "false"
    body = e.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    return body


def put_parquet(world: dict[str, Any], key: str, n: int) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"custom_id": [f"row-{i}" for i in range(n)],
                             "input": [text(i) for i in range(n)]}), buf, row_group_size=20)
    world["s3"].put_object(Bucket=world["bucket"], Key=key, Body=buf.getvalue())


def test_a_rerun_after_the_input_file_was_deleted_is_results_expired(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    client = world_sdk(world)
    f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(
        [emb_line(i, text(i), model=MODEL) for i in range(40)]))), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    run_with_failures(world, b.id, minilm, minilm_engine)
    done = client.batches.retrieve(b.id)
    assert done.request_counts is not None and done.request_counts.failed == 4

    client.files.delete(f.id)
    err = retry_refused(client, b.id)
    assert err["code"] == "results_expired" and f.id in err["message"]
    assert not [x for x in client.batches.list() if x.input_file_id != f.id]  # no child made


def test_a_rerun_after_the_dataset_changed_is_a_409_saying_so(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    ctx, client, bucket = world["ctx"], world_sdk(world), world["bucket"]
    locations.add(ctx, world["project"], f"s3://{bucket}/", "read")
    put_parquet(world, "d/part-0.parquet", 40)
    b = client.post("/batches", cast_to=BatchObject, body={
        "endpoint": "/v1/embeddings", "completion_window": "24h", "body": {"model": MODEL},
        "input_dataset": {"uri": f"s3://{bucket}/d/"}})
    run_with_failures(world, b.id, minilm, minilm_engine)
    done = client.batches.retrieve(b.id)
    assert done.request_counts is not None and done.request_counts.failed == 4

    put_parquet(world, "d/part-0.parquet", 41)  # rewritten after the batch read it
    err = retry_refused(client, b.id)
    assert err["code"] == "source_changed" and err["param"] == "input_dataset.uri"
    assert "part-0.parquet changed after it was listed" in err["message"]
    assert "submit a new batch" in err["message"]

    world["s3"].delete_object(Bucket=bucket, Key="d/part-0.parquet")  # or deleted
    assert retry_refused(client, b.id)["code"] == "source_changed"
    assert [x.id for x in client.batches.list()] == [b.id]  # no child made
