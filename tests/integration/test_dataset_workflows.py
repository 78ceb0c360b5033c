"""A data team's work over datasets in place, as a user calls it: ``inferq submit``
with request defaults (a structured extraction: a JSON schema, max_tokens,
temperature, a template and the id column), the SDK's ``batches.create`` and
``inferq.client.dataset`` without a file, a rerun (``inferq retry``) whose results land
in the batch's output dataset (read back with pyarrow), and ``inferq status`` grouping
row errors. Against the session's S3 server (moto over HTTP) and the app served on a
loopback port, on a database and Redis DB of this test's own; the test is the control
worker and the batch worker (the real shard pipeline on the packaged MiniLM)."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from cli.main import main
from jobs.batches import locations, service
from jobs.batches import queries as repo
from jobs.batches.views import read_shard
from jobs.core.context import Context
from jobs.core.settings import Settings
from tests.helpers import lake_world, run_in_process, world_sdk

EMB, CHAT = "all-MiniLM-L6-v2", "extractor"
LONG = 20  # every 20th review is long: 5 % of them fail under the injected fault
OOM_ABOVE = 40  # tokens of a pass (rows x longest row) the injected fault allows


@pytest.fixture
def world(own_settings: Settings, s3_endpoint: str) -> Iterator[dict[str, Any]]:
    from werkzeug.serving import make_server

    w = lake_world(own_settings, s3_endpoint, "data-team",
                   {EMB: ("embeddings", 256), CHAT: ("chat", 2048)},
                   shard_rows=40, chunk_rows=20)
    locations.add(w["ctx"], w["project"], f"s3://{w['bucket']}/", "read_write")
    app = w["app"]
    srv = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield {**w, "url": f"http://127.0.0.1:{srv.server_port}/v1"}
    finally:
        srv.shutdown()


def inferq(world: dict[str, Any], *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--api-url", world["url"], "--api-key",
                                     world["key"]])


def put_reviews(world: dict[str, Any], key: str, n: int) -> None:
    t = pa.table({"review_id": [f"r{i:03d}" for i in range(n)],
                  "title": [f"title {i}" for i in range(n)],
                  "body": [("a long review " * 20) if i % LONG == 0 else f"short {i}"
                           for i in range(n)]})
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=20)
    world["s3"].put_object(Bucket=world["bucket"], Key=key, Body=buf.getvalue())


def shard_bodies(ctx: Context, batch_id: str) -> list[dict[str, Any]]:
    with ctx.db.session() as s:
        shards = repo.shards_of(s, batch_id)
        s.expunge_all()
    return [{"custom_id": r["custom_id"], **orjson.loads(r["body"])}
            for sh in shards for r in read_shard(ctx.store, sh)]


def test_a_structured_extraction_over_a_dataset_from_submit_alone(
        world: dict[str, Any], tmp_path: Path) -> None:
    ctx, bucket = world["ctx"], world["bucket"]
    put_reviews(world, "reviews/part-0.parquet", 30)
    schema = {"type": "object", "properties": {"sentiment": {"enum": ["pos", "neg"]}},
              "required": ["sentiment"], "additionalProperties": False}
    (tmp_path / "sentiment.json").write_text(json.dumps(schema))
    got = inferq(world, "submit", f"s3://{bucket}/reviews/*.parquet",
                 "--endpoint", "/v1/chat/completions", "--model", CHAT,
                 "--id-column", "review_id", "--template", "Review: {title}\n{body}",
                 "--system", "Extract the sentiment.", "--max-tokens", "32",
                 "--temperature", "0", "--response-format", f"@{tmp_path / 'sentiment.json'}",
                 "--body-default", "seed=7", "--output", f"s3://{bucket}/labels/run-1/")
    assert got.exit_code == 0, got.output
    batch_id = got.output.strip()
    b = world_sdk(world).batches.retrieve(batch_id)
    assert b.status == "validating" and b.endpoint == "/v1/chat/completions"
    service.validate_batch(ctx, batch_id)
    bodies = shard_bodies(ctx, batch_id)
    assert sorted(x["custom_id"] for x in bodies) == [f"r{i:03d}" for i in range(30)]
    first = next(x for x in bodies if x["custom_id"] == "r001")
    assert first["max_tokens"] == 32 and first["temperature"] == 0 and first["seed"] == 7
    assert first["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "sentiment", "schema": schema, "strict": True}}
    assert first["messages"] == [{"role": "system", "content": "Extract the sentiment."},
                                 {"role": "user", "content": "Review: title 1\nshort 1"}]

    # A body default the endpoint does not take is the API's 400, one line.
    got = inferq(world, "submit", f"s3://{bucket}/reviews/*.parquet", "--endpoint",
                 "/v1/chat/completions", "--model", CHAT, "--body-default", "bogus=1")
    assert got.exit_code == 1 and "bogus" in got.output, got.output
    got = inferq(world, "submit", f"s3://{bucket}/reviews/*.parquet", "--model", CHAT,
                 "--response-format", f"@{tmp_path / 'missing.json'}")
    assert got.exit_code == 2 and "missing.json" in got.output, got.output


def test_the_sdk_and_the_notebook_client_batch_a_dataset_without_a_file(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    from openai import omit

    from inferq import client as iq

    ctx, bucket, sdk = world["ctx"], world["bucket"], world_sdk(world)
    put_reviews(world, "emb/part-0.parquet", 10)
    source = {"uri": f"s3://{bucket}/emb/", "id_column": "review_id", "input_column": "title"}
    b = sdk.batches.create(input_file_id=omit, endpoint="/v1/embeddings",  # as docs/API.md
                           completion_window="24h",
                           extra_body={"input_dataset": source, "body": {"model": EMB}})
    assert b.status == "validating"
    run = iq.dataset(f"s3://{bucket}/emb/", EMB, endpoint=iq.EMBEDDINGS,
                     id_column="review_id", template="{title}: {body}", client=sdk)
    assert iq.dataset(f"s3://{bucket}/emb/", EMB, endpoint=iq.EMBEDDINGS,  # the same call
                      id_column="review_id", template="{title}: {body}",
                      client=sdk).batch_id == run.batch_id
    run_in_process(ctx, run.batch_id, minilm, minilm_engine)
    t = run.table(progress=False)
    assert sorted(t.column("review_id").to_pylist()) == [f"r{i:03d}" for i in range(10)]
    assert {len(v) for v in t.column("embedding").to_pylist()} == {384}


def test_a_rerun_lands_in_the_output_dataset_and_status_groups_the_errors(
        world: dict[str, Any], minilm: Any, minilm_engine: Any, tmp_path: Path) -> None:
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    ctx, bucket, s3 = world["ctx"], world["bucket"], world["s3"]
    n = 80
    put_reviews(world, "reviews/part-0.parquet", n)
    got = inferq(world, "submit", f"s3://{bucket}/reviews/", "--model", EMB,
                 "--id-column", "review_id", "--input-column", "body",
                 "--output", f"s3://{bucket}/vectors/run-1/")
    assert got.exit_code == 0, got.output
    parent = got.output.strip()
    minilm.fault_oom_above_tokens = OOM_ABOVE
    try:
        run_in_process(ctx, parent, minilm, minilm_engine)
    finally:
        minilm.fault_oom_above_tokens = 0
    failed = [f"r{i:03d}" for i in range(0, n, LONG)]

    # status: the row errors grouped by code, with the first requests; --exit-code.
    got = inferq(world, "status", parent)
    assert got.exit_code == 0, got.output
    lines = [x for x in got.output.splitlines() if x.strip().startswith("failed:")]
    assert len(lines) == 1, got.output
    assert "request_too_large: 4 requests, line 1 (r000), line 2 (r020), line 3 (r040), …" \
        in lines[0], lines[0]
    got = inferq(world, "status", parent, "--exit-code")
    assert got.exit_code == 3, got.output

    fs = pafs.S3FileSystem(endpoint_override=s3.meta.endpoint_url, access_key="testing",
                           secret_key="testing", region="us-east-1")

    def dataset() -> pa.Table:
        return pads.dataset(f"{bucket}/vectors/run-1/", filesystem=fs, format="parquet",
                            exclude_invalid_files=True).to_table()

    before = dataset()
    errs = before.filter(pa.compute.is_valid(before.column("error_code")))
    assert sorted(errs.column("review_id").to_pylist()) == failed

    got = inferq(world, "retry", parent)
    assert got.exit_code == 0, got.output
    child = got.output.strip()
    with pytest.raises(openai.ConflictError) as e:  # the prefix is the rerun's while it runs
        world_sdk(world).post("/batches", cast_to=object, body={
            "endpoint": "/v1/embeddings", "completion_window": "24h",
            "body": {"model": EMB}, "input_dataset": {"uri": f"s3://{bucket}/reviews/",
                                                      "id_column": "review_id",
                                                      "input_column": "body"},
            "output_dataset": {"uri": f"s3://{bucket}/vectors/run-1/more/"}})
    assert e.value.body["code"] == "output_in_use" and child in e.value.message  # type: ignore[index]
    run_in_process(ctx, child, minilm, minilm_engine)
    done = world_sdk(world).batches.retrieve(child)
    assert done.status == "completed", done.errors

    after = dataset()  # the rows where the data lives: every id once, none an error
    assert sorted(after.column("review_id").to_pylist()) == [f"r{i:03d}" for i in range(n)]
    assert after.column("error_code").null_count == n
    assert set(after.column("status_code").to_pylist()) == {200}
    manifest = orjson.loads(s3.get_object(Bucket=bucket,
                                          Key="vectors/run-1/_manifest.json")["Body"].read())
    assert manifest["batch_id"] == parent and manifest["reruns"] == [child]
    assert manifest["rows"] == n and manifest["columns"][0] == "review_id"
    assert sum(p["rows"] for p in manifest["parts"]) == n
    s3.head_object(Bucket=bucket, Key="vectors/run-1/_SUCCESS")
    got = inferq(world, "status", child, "--exit-code")
    assert got.exit_code == 0, got.output

    # The merged download keeps the dataset's id column too.
    got = inferq(world, "results", parent, "--merged", "-o", str(tmp_path / "all.parquet"))
    assert got.exit_code == 0, got.output
    merged = pq.read_table(tmp_path / "all.parquet")
    assert merged.column_names[0] == "review_id" and "custom_id" not in merged.column_names
    assert merged.column("error_code").null_count == n


def test_a_default_rerun_skips_what_a_rerun_cannot_fix(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    ctx, bucket = world["ctx"], world["bucket"]
    n = 12
    t = pa.table({"review_id": [f"r{i}" for i in range(n)],
                  "body": [("x " * 400) if i % 4 == 0 else f"short {i}" for i in range(n)]})
    buf = io.BytesIO()
    pq.write_table(t, buf)
    world["s3"].put_object(Bucket=bucket, Key="long/part-0.parquet", Body=buf.getvalue())
    got = inferq(world, "submit", f"s3://{bucket}/long/", "--model", EMB,
                 "--id-column", "review_id", "--input-column", "body")
    assert got.exit_code == 0, got.output
    parent = got.output.strip()
    run_in_process(ctx, parent, minilm, minilm_engine)
    got = inferq(world, "status", parent)
    assert "context_length_exceeded: 3 requests" in got.output, got.output

    got = inferq(world, "retry", parent)  # nothing a rerun could fix
    assert got.exit_code == 1, got.output
    assert "3 failed with context_length_exceeded" in got.output
    assert "--error-code" in got.output
    got = inferq(world, "retry", parent, "--error-code", "context_length_exceeded")
    assert got.exit_code == 0, got.output  # named: rerun anyway
    sent = world_sdk(world).files.content(
        world_sdk(world).batches.retrieve(got.output.strip()).input_file_id).content
    assert sorted(orjson.loads(x)["custom_id"] for x in sent.splitlines()) == ["r0", "r4", "r8"]
