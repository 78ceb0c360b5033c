"""Datasets in place: a batch over a prefix of Parquet files on S3, against a bare scan.

scan: ``pyarrow.dataset`` over the same prefix with pyarrow's own S3 filesystem (its
C++ reader, threads of its own), reading the columns the batch reads (the id and the
template's columns) to the last record batch; nothing else.
inferq: ``POST /v1/batches`` with ``input_dataset`` (the prefix, a prompt template over
two columns, a system prompt, chat) through the app in this process, then the control
task body (``jobs.batches.service.validate_batch``): every object read in its pinned version
by ranged GETs, every row checked and rendered, the shards (1,000 rows each, the
default) written to the same S3 server, the batch in progress. Timed from the POST to
the batch's shards queued.

S3 is moto's ThreadedMotoServer over HTTP in a process of its own; PostgreSQL and
Redis are the embedded ones. Rounds alternate scan, inferq. Reported: rows/s of
each, the ratio inferq ÷ scan per round (median [min–max]), and this process's RSS
before the first round and at its peak in the inferq rounds (it must not grow with
the dataset: it is read a record batch at a time).

``--e2e N``: then a batch of N rows (the same files' first rows, embeddings) runs to
its end on the packaged MiniLM in this process, with an ``output_dataset``, and its
output is read back with DuckDB from the destination prefix: every id once.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import random
import time
from typing import Any

from bench.common import report, spread
from bench.uploads import AWS, Peak, backends, rss_tree

MB = 1024 * 1024
BUCKET = "bench-lake"
COLUMNS = ["review_id", "title", "body"]
TEMPLATE = "Classify this review: {title}\n{body}"
WORDS = ("good bad great slow fast broke works love hate returned cheap solid price "
         "quality arrived late early box battery screen size colour fits").split()


def write_files(s3: Any, files: int, rows: int) -> int:
    """``files`` Parquet objects of ``rows`` rows each (an id, a title, a body, a rating
    and a column no request reads); returns their bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi)))

    total = 0
    for f in range(files):
        start = f * rows
        t = pa.table({
            "review_id": pa.array(range(start, start + rows), pa.int64()),
            "title": [text(2, 6) for _ in range(rows)],
            "body": [text(8, 60) for _ in range(rows)],
            "rating": [i % 5 + 1 for i in range(start, start + rows)],
            "notes": [text(4, 20) for _ in range(rows)],
        })
        buf = io.BytesIO()
        pq.write_table(t, buf, row_group_size=100_000, compression="zstd")
        s3.put_object(Bucket=BUCKET, Key=f"reviews/part-{f:03d}.parquet", Body=buf.getvalue())
        total += buf.tell()
    return total


def scan(endpoint: str) -> tuple[float, int]:
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    t0 = time.perf_counter()
    fs = pafs.S3FileSystem(endpoint_override=endpoint, access_key=AWS["AWS_ACCESS_KEY_ID"],
                           secret_key=AWS["AWS_SECRET_ACCESS_KEY"], region="us-east-1")
    d = pads.dataset(f"{BUCKET}/reviews/", filesystem=fs, format="parquet")
    n = sum(b.num_rows for b in d.to_batches(columns=COLUMNS))
    return time.perf_counter() - t0, n


def submit(client: Any, output: str | None = None, endpoint: str = "/v1/chat/completions",
           model: str = "SmolLM2-135M-Instruct", uri: str = f"s3://{BUCKET}/reviews/"
           ) -> str:
    from openai.types import Batch

    body: dict[str, Any] = {
        "endpoint": endpoint, "completion_window": "24h",
        "body": {"model": model, **({"max_tokens": 8} if endpoint != "/v1/embeddings"
                                    else {})},
        "input_dataset": {"uri": uri, "id_column": "review_id", "template": TEMPLATE,
                          **({"system": "Answer with one word: positive or negative."}
                             if endpoint != "/v1/embeddings" else {})}}
    if output is not None:
        body["output_dataset"] = {"uri": output}
    b = client.post("/batches", cast_to=Batch, body=body)
    return str(b.id)


def inferq(ctx: Any, client: Any) -> tuple[float, int]:
    from jobs.batches import service

    t0 = time.perf_counter()
    batch_id = submit(client)
    service.validate_batch(ctx, batch_id)
    dt = time.perf_counter() - t0
    b = client.batches.retrieve(batch_id)
    assert b.status == "in_progress", b.errors
    n = b.request_counts.total
    client.batches.cancel(batch_id)
    ctx.store.delete_prefix(f"batches/{batch_id}/")
    return dt, n


def e2e(ctx: Any, client: Any, s3: Any, endpoint: str, rows: int) -> dict[str, Any]:
    """A batch of ``rows`` rows to its end on MiniLM, its output read back with DuckDB."""
    import duckdb
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from jobs.batches import finalize, service
    from jobs.batches import queries as repo
    from jobs.core.schema import Model
    from workers.engines.batching import BatchPolicy
    from workers.engines.embeddings import EmbeddingEngine
    from workers.lanes.batch import run_shard
    from workers.models.embeddings import EmbeddingModel
    from workers.models.residency import Residency, Resident
    from workers.process.breaker import Breaker
    from workers.process.runtime import WorkerRuntime

    fs = pafs.S3FileSystem(endpoint_override=endpoint, access_key=AWS["AWS_ACCESS_KEY_ID"],
                           secret_key=AWS["AWS_SECRET_ACCESS_KEY"], region="us-east-1")
    first = pq.read_table(f"{BUCKET}/reviews/part-000.parquet", filesystem=fs).slice(0, rows)
    buf = io.BytesIO()
    pq.write_table(first, buf)
    s3.put_object(Bucket=BUCKET, Key="small/part-000.parquet", Body=buf.getvalue())
    out = f"s3://{BUCKET}/out/{time.time_ns()}/"
    t0 = time.perf_counter()
    batch_id = submit(client, out, "/v1/embeddings", "all-MiniLM-L6-v2",
                      f"s3://{BUCKET}/small/")
    service.validate_batch(ctx, batch_id)
    model = EmbeddingModel("all-MiniLM-L6-v2")
    engine = EmbeddingEngine(model, BatchPolicy(4096, 64))
    try:
        held = Residency(ctx, loader=lambda m: None)  # type: ignore[arg-type,return-value]
        held.hold(Resident(Model(name="all-MiniLM-L6-v2", version="1", kind="embeddings",
                                 files=[]), 0, inputs=model, engine=engine), "configured")
        rt = WorkerRuntime(ctx.settings, ctx, "bench-worker", Breaker(1000, 1.0), held,
                           "cpu")
        with ctx.db.session() as s:
            shards = [sh.id for sh in repo.shards_of(s, batch_id)]
        for sid in shards:
            run_shard(rt, sid, lambda: False)
        finalize.finalize_batch(ctx, batch_id)
    finally:
        engine.stop()
    took = time.perf_counter() - t0
    b = client.batches.retrieve(batch_id)
    assert b.status == "completed", b.errors
    d = pads.dataset(out.removeprefix("s3://"), filesystem=fs, format="parquet")
    con = duckdb.connect()
    con.register("out", d)
    n, distinct, ok = con.execute(
        "select count(*), count(distinct review_id), count(*) filter (status_code = 200) "
        "from out").fetchone()  # type: ignore[misc]
    return {"rows": rows, "seconds": took, "read_back": n, "distinct_ids": distinct,
            "succeeded": ok, "shards": len(shards)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--rows", type=int, default=100_000, help="rows per file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--e2e", type=int, default=0, help="rows of the end-to-end batch")
    args = ap.parse_args()

    import httpx2
    from openai import OpenAI

    from api.app import create_app
    from jobs.batches import locations
    from jobs.core.settings import Settings
    from jobs.fleet import builtin_models, registry
    from jobs.tenants import auth
    from storage.db import migrate

    with backends(BUCKET) as b:
        os.environ["AWS_ENDPOINT_URL"] = b.endpoint
        s3, endpoint = b.s3, b.endpoint
        size = write_files(s3, args.files, args.rows)
        st = Settings(data_dir=b.tmp, database_url=b.database_url, redis_url=b.redis_url,
                      object_store_url=f"s3://{BUCKET}/inferq")
        migrate(st.database_url)
        app = create_app(st)
        ctx = app.extensions["inferq"]
        builtin_models.register_builtin_models(ctx)
        # A registry row for the chat model the batch names (validation reads no
        # weights; no worker runs these batches).
        registry.register(ctx, "SmolLM2-135M-Instruct", "1", "chat", "bench",
                          [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}], 2048)
        project, key = auth.create_tenant(ctx, "bench")
        locations.add(ctx, project, f"s3://{BUCKET}/", "read_write")
        http = httpx2.Client(transport=httpx2.WSGITransport(app=app),
                             base_url="http://bench")
        client = OpenAI(base_url="http://bench/v1", api_key=key, http_client=http,
                        max_retries=0)
        scan(endpoint)  # one-off costs: imports, clients, connections
        # The objects made so far (this harness's, the app's) are no garbage: a full
        # collection in a round must not walk them (a worker's heap is not this one).
        gc.collect()
        gc.freeze()
        rss_before = rss_tree(os.getpid())
        scan_t, ours_t, peaks = [], [], []
        for _ in range(args.rounds):
            took, n_scan = scan(endpoint)
            scan_t.append(took)
            with Peak(os.getpid()) as peak:
                took, n = inferq(ctx, client)
            ours_t.append(took)
            peaks.append(peak.peak)
            assert n == n_scan == args.files * args.rows, (n, n_scan)
        end = e2e(ctx, client, s3, endpoint, args.e2e) if args.e2e else None
    total = args.files * args.rows
    ratios = [s / o for s, o in zip(scan_t, ours_t, strict=True)]
    rows = [["scan: pyarrow.dataset over S3, rows/s", spread([total / t for t in scan_t])],
            ["inferq: created, validated and sharded, rows/s",
             spread([total / t for t in ours_t])],
            ["inferq ÷ scan throughput", spread(ratios)],
            ["RSS before the first round, MB", f"{rss_before / MB:.0f}"],
            ["RSS peak while validating, MB", spread([p / MB for p in peaks])]]
    if end is not None:
        rows.append([f"end to end: {end['rows']} rows on MiniLM, s", f"{end['seconds']:.1f}"])
        rows.append(["read back by DuckDB: rows, distinct ids, succeeded",
                     f"{end['read_back']}, {end['distinct_ids']}, {end['succeeded']}"])
    report("datasets", f"datasets in place: {args.files} Parquet files, {total:,} rows, "
           f"{size / MB:.0f} MB on moto S3, {args.rounds} rounds", ["", "median [range]"], rows,
           {"files": args.files, "rows": total, "bytes": size, "rounds": args.rounds,
            "scan_seconds": scan_t, "inferq_seconds": ours_t, "ratio": ratios,
            "rss_before": rss_before, "rss_peaks": peaks, "e2e": end})
    print(f"datasets: {total:,} rows, scan {spread([total / t for t in scan_t])} rows/s, "
          f"inferq {spread([total / t for t in ours_t])} rows/s, inferq ÷ scan "
          f"{spread(ratios)}; RSS {rss_before / MB:.0f} MB before, peak "
          f"{max(peaks) / MB:.0f} MB")


if __name__ == "__main__":
    main()
