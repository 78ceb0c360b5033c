"""Batches over datasets in place (``input_dataset``) and output datasets
(``output_dataset``), against the session's S3 server (moto over HTTP), on a database and
Redis DB of this test's own; the test is the control worker and the batch worker (the
real shard pipeline on the packaged MiniLM). The output is read back with DuckDB."""

from __future__ import annotations

import io
from typing import Any

import openai
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai import OpenAI
from openai.types import Batch as BatchObject

from jobs.batches import locations, service
from jobs.batches import queries as repo
from jobs.core.settings import Settings
from jobs.fleet import catalog, registry
from jobs.tenants import auth
from tests.helpers import lake_world, run_in_process, world_sdk

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture
def world(own_settings: Settings, s3_endpoint: str) -> dict[str, Any]:
    w = lake_world(own_settings, s3_endpoint, "datasets", {MODEL: ("embeddings", 256)},
                   shard_rows=40, chunk_rows=20)
    return {**w, "other": auth.create_tenant(w["ctx"], "datasets-other")[1]}


def create(client: OpenAI, **body: Any) -> BatchObject:
    return client.post("/batches", cast_to=BatchObject, body={
        "endpoint": "/v1/embeddings", "completion_window": "24h",
        "body": {"model": MODEL}, **body})


def put_parquet(world: dict[str, Any], key: str, table: pa.Table) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=25)
    world["s3"].put_object(Bucket=world["bucket"], Key=key, Body=buf.getvalue())


def reviews(start: int, n: int) -> pa.Table:
    return pa.table({"review_id": list(range(start, start + n)),
                     "title": [f"title {i}" for i in range(start, start + n)],
                     "body": [None if i % 17 == 0 else f"body of review {i}"
                              for i in range(start, start + n)]})


def test_a_templated_dataset_in_place_becomes_an_output_dataset(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    ctx, client, bucket = world["ctx"], world_sdk(world), world["bucket"]
    for i in range(3):
        put_parquet(world, f"reviews/part-{i}.parquet", reviews(i * 50, 50))
    world["s3"].put_object(Bucket=bucket, Key="reviews/_SUCCESS", Body=b"")  # skipped
    world["s3"].put_object(Bucket=bucket, Key="reviews/notes.txt", Body=b"not data")
    source = {"uri": f"s3://{bucket}/reviews/*.parquet", "id_column": "review_id",
              "template": "Review: {title}\n{body}"}
    output = {"uri": f"s3://{bucket}/out/run-1/"}

    # No location given to the project yet: refused, naming what to do.
    with pytest.raises(openai.PermissionDeniedError) as e:
        create(client, input_dataset=source)
    assert "may not read" in e.value.message and "locations add" in e.value.message
    locations.add(ctx, world["project"], f"s3://{bucket}/reviews/", "read")
    with pytest.raises(openai.PermissionDeniedError) as e:  # a read location only
        create(client, input_dataset=source, output_dataset=output)
    assert "may not write" in e.value.message
    locations.add(ctx, world["project"], f"s3://{bucket}/out/", "write")
    # Another project has no location at all.
    with pytest.raises(openai.PermissionDeniedError):
        create(world_sdk(world, world["other"]), input_dataset=source)

    b = create(client, input_dataset=source, output_dataset=output)
    assert b.status == "validating"
    pinned = orjson.loads(client.files.content(b.input_file_id).content)
    assert [f["uri"].rsplit("/", 1)[1] for f in pinned["files"]] == [
        "part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert all(f["etag"] for f in pinned["files"])

    run_in_process(ctx, b.id, minilm, minilm_engine)
    done = client.batches.retrieve(b.id)
    assert done.status == "completed", done.errors
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (150, 150)
    with ctx.db.session() as s:
        # Views of the source (no shard objects): one per row group of 25 rows.
        shards = repo.shards_of(s, b.id)
        assert len(shards) == 6 and all(sh.source for sh in shards)

    # The output dataset, read where it landed by DuckDB (over pyarrow's S3 reader).
    import duckdb
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    names = sorted(o["Key"] for o in world["s3"].list_objects_v2(
        Bucket=bucket, Prefix="out/run-1/")["Contents"])
    assert names == ["out/run-1/_SUCCESS", "out/run-1/_manifest.json",
                     *[f"out/run-1/part-{i:06d}.parquet" for i in range(6)]]
    fs = pafs.S3FileSystem(endpoint_override=world["s3"].meta.endpoint_url,
                           access_key="testing", secret_key="testing", region="us-east-1")
    out = pads.dataset(f"{bucket}/out/run-1/", filesystem=fs, format="parquet",
                       exclude_invalid_files=True)
    con = duckdb.connect()
    con.register("out", out)
    ids = con.execute("select review_id from out").fetchall()
    assert sorted(int(r[0]) for r in ids) == list(range(150))  # every id once
    dims = con.execute("select distinct len(embedding), status_code from out").fetchall()
    assert dims == [(384, 200)]
    manifest = orjson.loads(world["s3"].get_object(
        Bucket=bucket, Key="out/run-1/_manifest.json")["Body"].read())
    assert manifest["rows"] == 150 and manifest["batch_id"] == b.id
    # The rendered template is what was embedded: row 1's text, embedded alone, matches.
    vec = con.execute("select embedding from out where review_id = '1'").fetchone()
    assert vec is not None
    from workers.models.token_count import embedding_ids

    direct = minilm.embed(embedding_ids(minilm.tokenizer, ["Review: title 1\nbody of review 1"]))[0]
    assert max(abs(a - b) for a, b in zip(vec[0], direct, strict=True)) < 1e-4

    # An output prefix that holds objects already is refused.
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input_dataset=source, output_dataset=output)
    assert e.value.body["code"] == "output_exists", e.value.body  # type: ignore[index]


def test_dataset_errors_are_clear(world: dict[str, Any]) -> None:
    ctx, client, bucket = world["ctx"], world_sdk(world), world["bucket"]
    locations.add(ctx, world["project"], f"s3://{bucket}/", "read_write")
    put_parquet(world, "d/a.parquet", pa.table({"custom_id": ["a", "b", "a"],
                                                "input": ["x", "", "z"]}))

    def refused(code: str | None = None, **source: Any) -> str:
        with pytest.raises(openai.BadRequestError) as e:
            create(client, input_dataset={"uri": f"s3://{bucket}/d/", **source})
        if code is not None:
            assert e.value.body["code"] == code, e.value.body  # type: ignore[index]
        return e.value.message

    assert "no objects match" in refused("dataset_empty", uri=f"s3://{bucket}/nothing/")
    assert "input_column or template" in refused(input_column="a", template="{a}")
    assert "column name in braces" in refused(template="{a!r}")
    assert "names no column" in refused(template="plain text")
    assert "system prompt" in refused(system="be brief")  # embeddings have none
    assert "starts with s3://" in refused(uri="http://example.com/x")
    with pytest.raises(openai.BadRequestError) as e:  # both inputs
        create(client, input_file_id="file-x", input_dataset={"uri": f"s3://{bucket}/d/"})
    assert "one of the two" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/batches", cast_to=BatchObject, body={
            "endpoint": "/v1/embeddings", "completion_window": "24h",
            "input_dataset": {"uri": f"s3://{bucket}/d/"}})
    assert e.value.body["code"] == "missing_model"  # type: ignore[index]

    # Validation: a repeated id fails the batch with both rows; an empty input is an
    # error line of its own.
    b = create(client, input_dataset={"uri": f"s3://{bucket}/d/"})
    service.validate_batch(ctx, b.id)
    failed = client.batches.retrieve(b.id)
    assert failed.status == "failed" and failed.errors and failed.errors.data
    assert failed.errors.data[0].code == "duplicate_custom_id"
    assert "rows 1 and 3" in (failed.errors.data[0].message or "")

    # A missing column names the file and its columns.
    put_parquet(world, "e/a.parquet", pa.table({"id": ["a"], "text": ["x"]}))
    b = create(client, input_dataset={"uri": f"s3://{bucket}/e/a.parquet"})
    service.validate_batch(ctx, b.id)
    failed = client.batches.retrieve(b.id)
    assert failed.errors and failed.errors.data[0].code == "invalid_dataset"
    assert "no column 'custom_id'" in (failed.errors.data[0].message or "")
    assert "its columns: 'id', 'text'" in (failed.errors.data[0].message or "")

    # The source changes after the batch pinned it: the batch fails, saying so.
    b = create(client, input_dataset={"uri": f"s3://{bucket}/e/a.parquet",
                                      "id_column": "id", "input_column": "text"})
    put_parquet(world, "e/a.parquet", pa.table({"id": ["a", "b"], "text": ["x", "y"]}))
    service.validate_batch(ctx, b.id)
    failed = client.batches.retrieve(b.id)
    assert failed.errors and failed.errors.data[0].code == "source_changed"
    assert "changed after it was listed" in (failed.errors.data[0].message or "")


def test_jsonl_rows_in_place(world: dict[str, Any]) -> None:
    """JSONL rows with integer ids and a chat template with a system prompt: the
    shards hold the requests as the chat schema reads them."""
    ctx, client, bucket = world["ctx"], world_sdk(world), world["bucket"]
    registry.register(ctx, "chatty", "1", "chat", "test",
                      [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}], 256)
    catalog.invalidate(ctx)
    locations.add(ctx, world["project"], f"s3://{bucket}/j/", "read")
    rows = b"".join(orjson.dumps({"n": i, "q": f"question {i}", "extra": [i]}) + b"\n"
                    for i in range(30))
    world["s3"].put_object(Bucket=bucket, Key="j/rows.jsonl", Body=rows)
    b = client.post("/batches", cast_to=BatchObject, body={
        "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "body": {"model": "chatty", "max_tokens": 4, "temperature": 0},
        "input_dataset": {"uri": f"s3://{bucket}/j/rows.jsonl", "id_column": "n",
                          "template": "Q: {q}", "system": "Answer in one word."}})
    service.validate_batch(ctx, b.id)
    got = client.batches.retrieve(b.id)
    assert got.status == "in_progress", got.errors
    with ctx.db.session() as s:
        shard = repo.shards_of(s, b.id)[0]
    table = pq.read_table(io.BytesIO(ctx.store.get_bytes(shard.object_key)))
    first = table.to_pylist()[0]
    body = orjson.loads(first["body"])
    assert body["messages"] == [{"role": "system", "content": "Answer in one word."},
                                {"role": "user", "content": f"Q: question {first['custom_id']}"}]
    assert body["max_tokens"] == 4 and body["model"] == "chatty"
