"""Uploads: a large JSONL through the Uploads API vs the same bytes straight to S3.

api: ``client.uploads.upload_file_chunked`` of the official SDK (its defaults: 64 MB
parts sent one after another, no md5), against the API served by gunicorn (the
stack's command, ``cli.command_lines.api_command``: one process of the gevent edge worker),
which streams each part into the object store as an object of its own and, at
completion, ends them into the File's object (S3: parts of 5 MiB and more go straight
into the upload's own multipart upload, numbered as they come). The
time runs from ``create`` to the completed upload with its File.
raw: boto3's multipart upload of the same file to the same S3 server: one
``create_multipart_upload``, ``upload_part`` of each 64 MB part in order, one
``complete_multipart_upload``; what a client with S3 credentials of its own would do.

S3 is moto's ThreadedMotoServer over HTTP, in a process of its own (neither side's
client shares its interpreter); PostgreSQL and Redis are the embedded ones. Rounds
alternate raw, api; each side's object (the File, through the API) is deleted after
its round. Reported: MB/s of each side (MB = 2^20 bytes), the ratio api ÷ raw per round
(median [min–max]), each side's last call (complete) apart and the ratio of the
times before it, and the API process's RSS (psutil: the gunicorn master and its
worker, sampled every 50 ms) before the first upload and at its peak: it must not grow
with the file. Workload: N MB of embeddings requests (``bench.workload.texts``, seed 0),
whole lines, just over N MB.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import free_port, report, spread

MB = 1024 * 1024
PART = 64 * MB
BUCKET = "bench-uploads"
AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
       "AWS_DEFAULT_REGION": "us-east-1"}


def serve_s3(port: int) -> None:
    """The child process: moto's threaded S3 server until it is terminated."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    while True:
        time.sleep(3600)



@dataclass
class Backends:
    """What a benchmark's run stands on: a temporary folder, moto's S3 server (its
    endpoint, a boto3 client, the bucket made) and an embedded PostgreSQL and Redis."""

    tmp: Path
    endpoint: str
    s3: Any
    database_url: str
    redis_url: str


@contextlib.contextmanager
def backends(bucket: str) -> Iterator[Backends]:
    """moto's S3 server in a spawned process of its own (neither side's client shares its
    interpreter) with ``bucket`` made, a PostgreSQL and a Redis of their own; all
    stopped, and the folder removed, on the way out."""
    import boto3
    from botocore.exceptions import EndpointConnectionError

    from storage.embedded import EmbeddedPostgres, EmbeddedRedis

    os.environ.update(AWS)
    s3_port = free_port()
    endpoint = f"http://127.0.0.1:{s3_port}"
    moto = multiprocessing.get_context("spawn").Process(target=serve_s3, args=(s3_port,),
                                                        daemon=True)
    moto.start()
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg")
        redis = EmbeddedRedis(Path(tmp) / "redis", port=free_port())
        try:
            s3 = boto3.client("s3", endpoint_url=endpoint)
            for attempt in range(100):
                try:
                    s3.create_bucket(Bucket=bucket)
                    break
                except EndpointConnectionError:  # the server is still starting
                    if attempt == 99:
                        raise
                    time.sleep(0.2)
            yield Backends(Path(tmp), endpoint, s3, pg.url, redis.url)
        finally:
            redis.stop()
            pg.stop()
            moto.terminate()
            moto.join(10)

def write_jsonl(path: Path, size_mb: int) -> int:
    """Whole lines of embeddings requests until the file holds at least ``size_mb`` MB."""
    import json

    from bench.workload import texts

    lines = [json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/embeddings",
                         "body": {"model": "all-MiniLM-L6-v2", "input": t}}).encode() + b"\n"
             for i, t in texts(4096, seed=0)]
    block = b"".join(lines)
    total = 0
    with path.open("wb") as fh:
        while total < size_mb * MB:
            fh.write(block)
            total += len(block)
    return total


def rss_tree(pid: int) -> int:
    import psutil

    p = psutil.Process(pid)
    return sum(x.memory_info().rss for x in [p, *p.children(recursive=True)])


class Peak:
    """The largest RSS of a process tree while it is held (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, rss_tree(pid)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(0.05):
            self.peak = max(self.peak, rss_tree(self.pid))

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.done.set()
        self.thread.join()


def raw_upload(s3: Any, path: Path, key: str) -> tuple[float, float]:
    """Its time, and that of its last call (complete_multipart_upload)."""
    t0 = time.perf_counter()
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = []
    with path.open("rb") as fh:
        while data := fh.read(PART):
            n = len(parts) + 1
            r = s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=n,
                               Body=data)
            parts.append({"PartNumber": n, "ETag": r["ETag"]})
    t1 = time.perf_counter()
    s3.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id,
                                 MultipartUpload={"Parts": parts})
    t2 = time.perf_counter()
    assert s3.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == path.stat().st_size
    s3.delete_object(Bucket=BUCKET, Key=key)
    return t2 - t0, t2 - t1


def api_upload(client: Any, path: Path) -> tuple[float, float]:
    """Its time, and that of its last call (complete: the parts composed)."""
    uploads = client.uploads
    complete = uploads.complete
    took: list[float] = []

    def timed(*args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return complete(*args, **kw)
        finally:
            took.append(time.perf_counter() - t)

    uploads.complete = timed  # what upload_file_chunked calls last
    try:
        t0 = time.perf_counter()
        up = uploads.upload_file_chunked(file=path, mime_type="application/jsonl",
                                         purpose="batch")
        dt = time.perf_counter() - t0
    finally:
        del uploads.complete
    assert up.status == "completed" and up.file.bytes == path.stat().st_size, up
    client.files.delete(up.file.id)
    return dt, took[0]


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited with {proc.returncode} at start")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the API did not answer /healthz in time")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1024, help="the file's size in MB")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from openai import OpenAI

    from cli.command_lines import api_command
    from jobs.core.context import Context
    from jobs.core.settings import Settings
    from jobs.tenants import auth
    from storage.db import migrate

    api_port = free_port()
    api: subprocess.Popen[bytes] | None = None
    with backends(BUCKET) as b:
        try:
            st = Settings(data_dir=b.tmp, database_url=b.database_url, redis_url=b.redis_url,
                          object_store_url=f"s3://{BUCKET}/inferq", api_port=api_port)
            migrate(st.database_url)
            ctx = Context(st)
            key = auth.create_tenant(ctx, "bench")[1]
            ctx.close()
            env = {**os.environ, **st.to_env(), **AWS, "AWS_ENDPOINT_URL": b.endpoint,
                   "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
            with (b.tmp / "api.log").open("ab") as log:
                api = subprocess.Popen(api_command("127.0.0.1", api_port), env=env,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
            wait_up(f"http://127.0.0.1:{api_port}", api)
            client = OpenAI(base_url=f"http://127.0.0.1:{api_port}/v1", api_key=key,
                            max_retries=0, timeout=600)

            path = b.tmp / "input.jsonl"
            size = write_jsonl(path, args.n)
            warm = b.tmp / "warm.jsonl"
            write_jsonl(warm, 8)
            api_upload(client, warm)  # one-off costs: imports, clients, connections
            raw_upload(b.s3, warm, "warm")
            rss_before = rss_tree(api.pid)
            raw_t, api_t, raw_last, api_last, peaks = [], [], [], [], []
            for i in range(args.rounds):
                took, last = raw_upload(b.s3, path, f"raw-{i}")
                raw_t.append(took)
                raw_last.append(last)
                with Peak(api.pid) as peak:
                    took, last = api_upload(client, path)
                api_t.append(took)
                api_last.append(last)
                peaks.append(peak.peak)
        finally:
            if api is not None:
                api.terminate()
                api.wait(30)
    mbs = size / MB
    ratios = [r / a for r, a in zip(raw_t, api_t, strict=True)]
    rows = [["raw: boto3 multipart upload (64 MB parts), MB/s", spread([mbs / t for t in raw_t])],
            ["api: client.uploads.upload_file_chunked (64 MB parts), MB/s",
             spread([mbs / t for t in api_t])],
            ["api ÷ raw throughput", spread(ratios)],
            ["raw: s in complete_multipart_upload", spread(raw_last)],
            ["api: s in complete (ending the multipart upload)", spread(api_last)],
            ["api ÷ raw throughput of the parts (before complete)", spread(
                [(r - rl) / (a - al) for r, rl, a, al in zip(raw_t, raw_last, api_t, api_last,
                                                            strict=True)])],
            ["API RSS before the first upload, MB", f"{rss_before / MB:.0f}"],
            ["API RSS peak while uploading, MB", spread([p / MB for p in peaks])]]
    report("uploads", f"uploads: {mbs:.0f} MB of JSONL to moto S3, {args.rounds} rounds",
           ["", "median [range]"], rows,
           {"n_mb": args.n, "bytes": size, "rounds": args.rounds, "part_bytes": PART,
            "raw_seconds": raw_t, "api_seconds": api_t, "ratio": ratios,
            "raw_complete_seconds": raw_last, "api_complete_seconds": api_last,
            "api_rss_before": rss_before, "api_rss_peaks": peaks})
    print(f"uploads: {mbs:.0f} MB, raw {spread([mbs / t for t in raw_t])} MB/s, api "
          f"{spread([mbs / t for t in api_t])} MB/s, api ÷ raw {spread(ratios)}; API RSS "
          f"{rss_before / MB:.0f} MB before, peak {max(peaks) / MB:.0f} MB")


if __name__ == "__main__":
    main()
