"""Data locations that cannot be left, and output prefixes owned by one batch, written
as the attacks: project A holds ``file://L/a/`` and B ``file://L/b/`` on one API; A
links into B's directory (a directory, a file, under a ``**`` glob, as its output
prefix), links ``/etc/passwd``, puts a FIFO in its location; two batches name one
output prefix. Real PostgreSQL and Redis (a database of this test's own), the API
through the SDK; the test is the control worker and the batch worker (the packaged
MiniLM), as in test_datasets.py."""

from __future__ import annotations

import io
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai import OpenAI
from openai.types import Batch as BatchObject

from jobs.batches import exports, locations, service
from jobs.batches import queries as repo
from jobs.batches.datasets import Manifest
from jobs.core.context import Context
from jobs.core.schema import File
from jobs.core.settings import Settings
from jobs.fleet import catalog, registry
from jobs.tenants import auth
from tests.helpers import api_error, run_in_process, world_sdk

MODEL = "all-MiniLM-L6-v2"
ROWS = b"".join(orjson.dumps({"custom_id": f"r{i}", "input": f"row {i}"}) + b"\n"
                for i in range(3))


@pytest.fixture
def world(own_settings: Settings, tmp_path: Path) -> Iterator[dict[str, Any]]:
    from api.app import create_app

    app = create_app(own_settings)
    ctx: Context = app.extensions["inferq"]
    registry.register(ctx, MODEL, "1", "embeddings", "test",  # a registry row only
                      [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}], 256)
    catalog.invalidate(ctx)
    lake = tmp_path / "L"
    a_project, a_key = auth.create_tenant(ctx, "lake-a")
    b_project, b_key = auth.create_tenant(ctx, "lake-b")
    for project, name in ((a_project, "a"), (b_project, "b")):
        (lake / name).mkdir(parents=True)
        locations.add(ctx, project, f"file://{lake}/{name}/", "read_write")
    (lake / "b/in").mkdir()
    (lake / "b/in/secret.jsonl").write_bytes(b'{"custom_id": "b1", "input": "B only"}\n')
    (lake / "b/outtarget").mkdir()
    yield {"app": app, "ctx": ctx, "key": a_key, "b_key": b_key, "lake": lake,
           "a": a_project, "b": b_project}


def create(client: OpenAI, source: str, output: str | None = None) -> BatchObject:
    return client.post("/batches", cast_to=BatchObject, body={
        "endpoint": "/v1/embeddings", "completion_window": "24h", "body": {"model": MODEL},
        "input_dataset": {"uri": source},
        **({"output_dataset": {"uri": output}} if output else {})})


def refused(client: OpenAI, source: str, output: str | None = None,
            status: type[openai.APIStatusError] = openai.BadRequestError) -> dict[str, Any]:
    with pytest.raises(status) as e:
        create(client, source, output)
    return api_error(e.value)


def bounded(fn: Callable[[], Any], seconds: float = 60) -> Any:
    """``fn``'s result, failing if it has not returned within ``seconds`` (a generous
    bound: it guards against a FIFO blocking forever)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked"
    return out[0] if out else None


def test_links_out_of_a_location_are_refused(world: dict[str, Any]) -> None:
    client, lake = world_sdk(world), world["lake"]
    base = f"file://{lake}/a"
    (lake / "a/rows.jsonl").write_bytes(ROWS)
    os.symlink(lake / "b/in", lake / "a/linkdir")
    os.symlink(lake / "b/in/secret.jsonl", lake / "a/linked.jsonl")
    os.symlink("/etc/passwd", lake / "a/passwd.jsonl")
    for source, link in ((f"{base}/linkdir/", "a/linkdir"),
                         (f"{base}/linkdir/secret.jsonl", "a/linkdir"),
                         (f"{base}/linked.jsonl", "a/linked.jsonl"),
                         (f"{base}/**.jsonl", "a/link"),  # the first link met
                         (f"{base}/", "a/link"),
                         (f"{base}/passwd.jsonl", "a/passwd.jsonl")):
        err = refused(client, source)
        assert err["code"] == "unsafe_path" and err["param"] == "input_dataset.uri", err
        assert f"{lake}/{link}" in err["message"] and "symbolic link" in err["message"], err
    # An output prefix that is a link into B's directory: refused, nothing lands there.
    os.symlink(lake / "b/outtarget", lake / "a/outlink")
    err = refused(client, f"{base}/rows.jsonl", f"{base}/outlink/")
    assert err["code"] == "unsafe_path" and err["param"] == "output_dataset.uri", err
    err = refused(client, f"{base}/rows.jsonl", f"{base}/outlink/deeper/")
    assert err["code"] == "unsafe_path", err
    assert list((lake / "b/outtarget").iterdir()) == []
    # The same dataset without the links is A's to read.
    b = create(client, f"{base}/rows.jsonl")
    assert b.status == "validating"


def test_a_fifo_never_blocks_and_another_batch_proceeds(world: dict[str, Any]) -> None:
    ctx, client, lake = world["ctx"], world_sdk(world), world["lake"]
    (lake / "a/fifo").mkdir()
    os.mkfifo(lake / "a/fifo/x.jsonl")
    err = bounded(lambda: refused(client, f"file://{lake}/a/fifo/"))
    assert err["code"] == "unsafe_path" and "x.jsonl is a FIFO" in err["message"], err
    # Listed as a file, a FIFO put in its place before validation: the batch fails
    # (the control worker is not held), and B's one-line batch then validates.
    (lake / "a/swap").mkdir()
    (lake / "a/swap/x.jsonl").write_bytes(ROWS)
    a_batch = create(client, f"file://{lake}/a/swap/")
    os.unlink(lake / "a/swap/x.jsonl")
    os.mkfifo(lake / "a/swap/x.jsonl")
    bounded(lambda: service.validate_batch(ctx, a_batch.id))
    failed = client.batches.retrieve(a_batch.id)
    assert failed.status == "failed" and failed.errors and failed.errors.data
    assert failed.errors.data[0].code == "source_changed"
    assert "is a FIFO" in (failed.errors.data[0].message or "")
    b_client = world_sdk(world, world["b_key"])
    b_batch = create(b_client, f"file://{lake}/b/in/secret.jsonl")
    bounded(lambda: service.validate_batch(ctx, b_batch.id))
    assert b_client.batches.retrieve(b_batch.id).status == "in_progress"


def test_one_output_prefix_is_one_batchs(world: dict[str, Any], minilm: Any,
                                         minilm_engine: Any) -> None:
    ctx, client, lake = world["ctx"], world_sdk(world), world["lake"]
    (lake / "a/rows.jsonl").write_bytes(ROWS)
    source, out = f"file://{lake}/a/rows.jsonl", f"file://{lake}/a/out/run/"
    first = create(client, source, out)
    # The same prefix, one around it, one inside it: 409 naming the batch that holds it.
    for other in (out, out.rstrip("/"), f"file://{lake}/a/out/", f"{out}sub/"):
        err = refused(client, source, other, openai.ConflictError)
        assert err["code"] == "output_in_use" and first.id in err["message"], err
    create(client, source, f"file://{lake}/a/out/run-2/")  # a path boundary: its own
    # Another project writing there too: refused, without A's batch id.
    locations.add(ctx, world["b"], f"file://{lake}/a/out/", "write")
    err = refused(world_sdk(world, world["b_key"]), f"file://{lake}/b/in/secret.jsonl", out,
                  openai.ConflictError)
    assert "another project" in err["message"] and first.id not in err["message"], err

    old = os.umask(0o022)
    try:
        run_in_process(ctx, first.id, minilm, minilm_engine)
    finally:
        os.umask(old)
    done = client.batches.retrieve(first.id)
    assert done.status == "completed", done.errors
    names = sorted(p.name for p in (lake / "a/out/run").iterdir())
    assert names == ["_SUCCESS", "_manifest.json", "part-000000.parquet"]
    for p in (lake / "a/out/run").iterdir():  # readable by the team's other users
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    assert stat.S_IMODE((lake / "a/out/run").stat().st_mode) == 0o755
    assert stat.S_IMODE((lake / "a/out").stat().st_mode) == 0o755
    # Ended: the prefix is free, and not empty.
    err = refused(client, source, out)
    assert err["code"] == "output_exists", err
    # A finalize that runs again finds only this batch's objects, and rewrites them.
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, first.id)
        shards = repo.shards_of(s, first.id)
        f = s.get(File, b.input_file_id) if b else None
    assert b is not None and f is not None
    manifest = Manifest.from_json(ctx.store.get_bytes(f.object_key))
    assert exports.write(ctx.store, b, shards, manifest, "batch_cancelled") == 3

    # A batch that ends without writing frees its prefix for the next.
    cancelled = create(client, source, f"file://{lake}/a/out/c/")
    client.batches.cancel(cancelled.id)
    service.validate_batch(ctx, cancelled.id)
    assert client.batches.retrieve(cancelled.id).status == "cancelled"
    assert create(client, source, f"file://{lake}/a/out/c/").status == "validating"


def test_an_output_prefix_swapped_for_a_link_lands_nothing(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    ctx, client, lake = world["ctx"], world_sdk(world), world["lake"]
    (lake / "a/rows.jsonl").write_bytes(ROWS)
    b = create(client, f"file://{lake}/a/rows.jsonl", f"file://{lake}/a/outlink/")
    os.symlink(lake / "b/outtarget", lake / "a/outlink")  # after the batch was created
    run_in_process(ctx, b.id, minilm, minilm_engine)
    failed = client.batches.retrieve(b.id)
    assert failed.status == "failed" and failed.errors and failed.errors.data
    assert failed.errors.data[0].code == "finalize_failed"
    assert f"{lake}/a/outlink passes through a symbolic link" in (
        failed.errors.data[0].message or "")
    assert list((lake / "b/outtarget").iterdir()) == []


def test_another_runs_parts_are_never_marked_complete(
        world: dict[str, Any], minilm: Any, minilm_engine: Any) -> None:
    ctx, client, lake = world["ctx"], world_sdk(world), world["lake"]
    (lake / "a/rows.jsonl").write_bytes(ROWS)
    b = create(client, f"file://{lake}/a/rows.jsonl", f"file://{lake}/a/out/")
    buf = io.BytesIO()  # a part of some other run, put there while the batch ran
    pq.write_table(pa.table({"custom_id": ["stale"]}), buf)
    (lake / "a/out").mkdir()
    (lake / "a/out/part-000000.parquet").write_bytes(buf.getvalue())
    (lake / "a/out/part-000007.parquet").write_bytes(buf.getvalue())
    run_in_process(ctx, b.id, minilm, minilm_engine)
    failed = client.batches.retrieve(b.id)
    assert failed.status == "failed" and failed.errors and failed.errors.data
    message = failed.errors.data[0].message or ""
    assert failed.errors.data[0].code == "finalize_failed", message
    assert "did not write (part-000000.parquet, part-000007.parquet)" in message
    assert sorted(p.name for p in (lake / "a/out").iterdir()) == [
        "part-000000.parquet", "part-000007.parquet"]  # untouched, nothing marked complete
    assert (lake / "a/out/part-000000.parquet").read_bytes() == buf.getvalue()


def test_batches_racing_for_one_prefix_get_it_once(world: dict[str, Any]) -> None:
    """Eight creations at once, as from several API processes: one holds the prefix,
    the others are refused (the reservation is read and written under one lock)."""
    from concurrent.futures import ThreadPoolExecutor

    from jobs.core.errors import Conflict
    from jobs.protocol.batch import BatchCreate

    ctx, lake = world["ctx"], world["lake"]
    (lake / "a/rows.jsonl").write_bytes(ROWS)
    req = BatchCreate.model_validate({
        "endpoint": "/v1/embeddings", "completion_window": "24h", "body": {"model": MODEL},
        "input_dataset": {"uri": f"file://{lake}/a/rows.jsonl"},
        "output_dataset": {"uri": f"file://{lake}/a/race/"}})
    barrier = threading.Barrier(8)

    def one() -> str:
        barrier.wait()
        try:
            return service.create_batch(ctx, world["a"], req).id
        except Conflict as e:
            assert e.code == "output_in_use", e.message
            return "refused"

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _i: one(), range(8)))
    assert got.count("refused") == 7, got
