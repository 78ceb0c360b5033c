"""Failure-matrix cases about backends: a PostgreSQL restart is answered with 503 +
retry-after (never 500) and the API recovers by itself; object-store errors are
retried with backoff, and a persistent one fails the shard with a clear error."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from jobs.core.settings import Settings
from jobs.tenants import auth
from storage.embedded import EmbeddedPostgres


@pytest.mark.slow
def test_postgres_restart_is_503_then_recovers(tmp_path: Path, own_redis_url: str) -> None:
    """A private PostgreSQL (never the machine's) is stopped and started again."""
    from api.app import create_app
    from jobs.core.context import Context
    from storage.db import migrate

    pg = EmbeddedPostgres(tmp_path / "pg")
    try:
        st = Settings(database_url=pg.url, redis_url=own_redis_url,
                      object_store_url=f"file://{tmp_path / 'objects'}", data_dir=tmp_path)
        migrate(st.database_url)
        ctx = Context(st)
        _, key = auth.create_tenant(ctx, "outage")
        ctx.close()
        client = create_app(st).test_client()
        client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
        assert client.get("/v1/batches").status_code == 200
        pg.stop()
        down = client.get("/v1/batches")
        assert down.status_code == 503, down.get_data(as_text=True)
        assert down.headers["retry-after"] and down.get_json()["error"]["code"] == "unavailable"
        assert client.get("/readyz").status_code == 503  # not ready; alive all the same
        assert client.get("/healthz").status_code == 200
        pg = EmbeddedPostgres(tmp_path / "pg")  # the same data dir: nothing lost
        deadline = time.monotonic() + 30
        while (r := client.get("/v1/batches")).status_code != 200:
            assert time.monotonic() < deadline, r.get_data(as_text=True)
            time.sleep(0.2)
        assert r.get_json()["object"] == "list"
    finally:
        pg.stop()


class Flaky:
    """An S3 client (process-edge fake) that fails ``failures`` times with a 503."""

    def __init__(self, real: Any, failures: int) -> None:
        self.real, self.failures, self.calls = real, failures, 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.real, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.failures > 0:
                self.failures -= 1
                raise ClientError({"Error": {"Code": "SlowDown", "Message": "try later"},
                                   "ResponseMetadata": {"HTTPStatusCode": 503}}, name)
            return target(*args, **kwargs)

        return call


def test_object_store_5xx_is_retried_then_gives_up(s3_endpoint: str) -> None:
    import boto3

    from storage.s3_store import S3Store

    real = boto3.client("s3", endpoint_url=s3_endpoint)
    prefix = f"flaky-{secrets.token_hex(4)}"
    store = S3Store("inferq-test", prefix=prefix, client=Flaky(real, failures=2))
    store.put_bytes("k", b"v")  # two 503s, then through
    assert store.get_bytes("k") == b"v" and store.client.calls == 4
    broken = S3Store("inferq-test", prefix=prefix, client=Flaky(real, failures=100))
    t0 = time.monotonic()
    with pytest.raises(ClientError):
        broken.size("k")
    assert broken.client.calls == 5 and time.monotonic() - t0 < 30  # bounded, no hang


@pytest.mark.slow
def test_a_persistently_unreadable_shard_fails_with_its_error(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    from storage import keys
    from tests.helpers import emb_line, jsonl, lines, upload, wait

    rows = [emb_line(i, f"text {i}") for i in range(30)]
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 60
    while fsdk.batches.retrieve(b.id).status == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    fctx.store.delete(keys.shard_input(b.id, 0))  # the shard's input is gone for good
    workers("s3fail", INFERQ_MAX_SHARD_ATTEMPTS="2")
    b = wait(fsdk, b.id, timeout=120)
    # Its requests cannot even be listed (their custom_ids were in the lost object), so
    # the batch fails, saying which shard and why, instead of claiming success.
    assert b.status == "failed" and b.request_counts.failed == 30
    assert b.errors is not None and b.errors.data[0].code == "shard_unreadable"
    assert "NoSuchKey" in b.errors.data[0].message or "not" in b.errors.data[0].message
    from jobs.core.schema import Shard

    with fctx.db.session() as s:
        sh = s.get(Shard, f"{b.id}.000000")
        assert sh.status == "failed" and "failed 2 times in a row without progress" in sh.error
        assert sh.attempt == 2 and sh.stalls == 1
    assert lines(fsdk, b.error_file_id) == []
