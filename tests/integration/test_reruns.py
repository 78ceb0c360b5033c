"""Reruns of what failed (``POST /v1/batches/{id}/retry``) and the merged results
(``GET /v1/batches/{id}/merged_output``), through the official SDK in strict response
validation against the app in this process, on a database and Redis DB of this test's
own and the session's S3 server; the test is the control worker and the batch worker
(the real shard pipeline on the packaged MiniLM). 5 % of the requests fail the first
time (out of memory: an injected fault of a small accelerator); their rerun, on the
same model without the fault, succeeds, and the merged output holds every custom_id
once, each succeeded."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai import OpenAI
from openai.types import Batch as BatchObject

from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.fleet import catalog, registry
from jobs.tenants import auth
from tests.helpers import emb_line, jsonl, run_in_process, world_sdk

MODEL = "all-MiniLM-L6-v2"
ROWS = 200
LONG = 20  # every 20th request is long: 5 % of them
OOM_ABOVE = 40  # tokens of a pass (rows x longest row) the injected fault allows


@pytest.fixture
def world(own_settings: Settings) -> Iterator[dict[str, Any]]:
    from api.app import create_app

    app = create_app(own_settings.model_copy(update={"shard_rows": 100, "chunk_rows": 50}))
    ctx: Context = app.extensions["inferq"]
    registry.register(ctx, MODEL, "1", "embeddings", "test",  # a registry row only
                      [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}], 256)
    catalog.invalidate(ctx)
    yield {"app": app, "ctx": ctx, "key": auth.create_tenant(ctx, "reruns")[1],
           "other": auth.create_tenant(ctx, "reruns-other")[1]}


def retry(client: OpenAI, batch_id: str, **body: Any) -> BatchObject:
    return client.post(f"/batches/{batch_id}/retry", body=body, cast_to=BatchObject)


def merged(client: OpenAI, batch_id: str) -> list[dict[str, Any]]:
    raw = client.get(f"/batches/{batch_id}/merged_output", cast_to=httpx2.Response)
    return [orjson.loads(x) for x in raw.content.splitlines() if x]


def code_of(line: dict[str, Any]) -> str | None:
    if line.get("error"):
        return str(line["error"]["code"])
    body = line["response"]["body"]
    return None if line["response"]["status_code"] == 200 else str(body["error"]["code"])


def test_a_rerun_of_the_failed_requests_completes_the_merged_output(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    ctx, client = world["ctx"], world_sdk(world)
    lines = [emb_line(i, ("a long request " * 20) if i % LONG == 0 else f"short {i}",
                      model=MODEL) for i in range(ROWS)]
    f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    parent = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                   completion_window="24h", metadata={"run": "first"},
                                   output_expires_after={"anchor": "created_at",
                                                         "seconds": 7200})
    with pytest.raises(openai.ConflictError) as e:  # it has not ended
        retry(client, parent.id)
    assert e.value.body["code"] == "batch_not_ended"  # type: ignore[index]
    minilm.fault_oom_above_tokens = OOM_ABOVE
    try:
        run_in_process(ctx, parent.id, minilm, minilm_engine)
    finally:
        minilm.fault_oom_above_tokens = 0
    first = client.batches.retrieve(parent.id)
    assert first.status == "completed" and first.request_counts is not None
    assert (first.request_counts.completed, first.request_counts.failed) == (190, 10)
    failed = {x["custom_id"] for x in merged(client, parent.id) if code_of(x)}
    assert failed == {f"req-{i}" for i in range(0, ROWS, LONG)}

    # Only some codes: none of the failures has this one.
    with pytest.raises(openai.BadRequestError) as e:
        retry(client, parent.id, error_codes=["rate_limit_exceeded"])
    assert e.value.body["code"] == "nothing_to_retry"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):  # another project's batch
        retry(world_sdk(world, world["other"]), parent.id)

    child = retry(client, parent.id, error_codes=["request_too_large"])
    assert child.model_extra is not None and child.model_extra["parent_batch_id"] == parent.id
    assert child.metadata == {"run": "first"} and child.endpoint == "/v1/embeddings"
    sent = client.files.content(child.input_file_id).content.splitlines()
    assert sorted(orjson.loads(x)["custom_id"] for x in sent) == sorted(failed)
    with pytest.raises(openai.ConflictError) as e:  # its rerun has not ended
        retry(client, parent.id)
    assert e.value.body["code"] == "retry_running"  # type: ignore[index]
    # While the rerun runs, the merged output is still the first run's.
    assert {x["custom_id"] for x in merged(client, parent.id) if code_of(x)} == failed

    run_in_process(ctx, child.id, minilm, minilm_engine)  # the fault is gone: a larger accelerator
    done = client.batches.retrieve(child.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (10, 0)
    assert done.output_file_id is not None
    out = client.files.retrieve(done.output_file_id)
    assert out.expires_at == out.created_at + 7200  # the parent's output expiry
    result = merged(client, parent.id)
    ids = [x["custom_id"] for x in result]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(ROWS))  # each once
    assert not [x for x in result if code_of(x)]  # every one succeeded
    assert all(len(x["response"]["body"]["data"][0]["embedding"]) == 384 for x in result)
    with pytest.raises(openai.BadRequestError) as e:  # nothing left to rerun
        retry(client, parent.id)
    assert e.value.body["code"] == "nothing_to_retry"  # type: ignore[index]


def test_the_merged_output_of_a_dataset_is_parquet(world: dict[str, Any], minilm: Any,
                                                   minilm_engine: Any, tmp_path: Path) -> None:
    """Through the CLI (``inferq retry``, ``inferq results --merged``) against the app
    served on a loopback port."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from click.testing import CliRunner
    from werkzeug.serving import make_server

    from cli.main import main

    ctx, client = world["ctx"], world_sdk(world)
    n = 40
    buf = io.BytesIO()
    pq.write_table(pa.table({
        "custom_id": [f"row-{i}" for i in range(n)],
        "input": [("a long request " * 20) if i % LONG == 0 else f"short {i}"
                  for i in range(n)]}), buf)
    f = client.files.create(file=("in.parquet", io.BytesIO(buf.getvalue())), purpose="batch")
    parent = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                   completion_window="24h",
                                   extra_body={"body": {"model": MODEL}})
    minilm.fault_oom_above_tokens = OOM_ABOVE
    try:
        run_in_process(ctx, parent.id, minilm, minilm_engine)
    finally:
        minilm.fault_oom_above_tokens = 0
    srv = make_server("127.0.0.1", 0, world["app"], threaded=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cli = ["--api-url", f"http://127.0.0.1:{srv.server_port}/v1", "--api-key", world["key"]]
    try:
        got = CliRunner().invoke(main, ["retry", parent.id, "--error-code", "no_such_code",
                                        *cli])
        assert got.exit_code == 1
        assert got.output.startswith("Error: ") and "no failed request" in got.output
        got = CliRunner().invoke(main, ["retry", parent.id, *cli])
        assert got.exit_code == 0, got.output
        child_id = got.output.strip()
        run_in_process(ctx, child_id, minilm, minilm_engine)
        got = CliRunner().invoke(main, ["results", parent.id, "--merged", "-o",
                                        str(tmp_path / "all.jsonl"), *cli])
        assert got.exit_code == 0, got.output
        assert got.output.strip() == f"wrote {tmp_path / 'all.parquet'}"  # its format's name
    finally:
        srv.shutdown()
    table = pq.read_table(tmp_path / "all.parquet")
    assert sorted(table.column("custom_id").to_pylist()) == sorted(f"row-{i}" for i in range(n))
    assert set(table.column("status_code").to_pylist()) == {200}
    assert table.column("error_code").null_count == n
    assert {len(v) for v in table.column("embedding").to_pylist()} == {384}
