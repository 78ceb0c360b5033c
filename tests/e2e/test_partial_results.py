"""Partial results (GET /v1/batches/{id}/output?partial=true&after=cursor) against real
processes: the API, a control worker and model workers on a database of their own
(``fstack``), one of them killed with SIGKILL mid-shard. Downloads taken with the
cursor while the batch runs, plus the last one after it ended, hold every custom_id
exactly once and are, line for line, the batch's output file."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from sqlalchemy import select

from jobs.batches import partial
from jobs.core.errors import InvalidRequest
from jobs.core.schema import Shard
from tests.conftest import CHUNK
from tests.helpers import emb_line, jsonl, upload, wait

pytestmark = pytest.mark.slow


def shards(ctx: Any, batch_id: str) -> list[Shard]:
    with ctx.db.session() as s:
        return list(s.scalars(select(Shard).where(Shard.batch_id == batch_id)
                              .order_by(Shard.index)))


@pytest.fixture
def api(fstack: Any) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=fstack.base_url, timeout=60,
                       headers={"Authorization": f"Bearer {fstack.api_key}"}) as c:
        yield c


class Reader:
    """A client of the partial output: each download passes the previous cursor."""

    def __init__(self, api: httpx2.Client, batch_id: str) -> None:
        self.api, self.batch_id = api, batch_id
        self.cursor: str | None = None
        self.lines: list[bytes] = []
        self.while_running = 0  # lines of downloads taken while the batch was not terminal
        self.downloads: list[tuple[str, int, int]] = []  # (status, chunks, lines)

    def download(self) -> httpx2.Response:
        params = {"partial": "true", **({"after": self.cursor} if self.cursor else {})}
        r = self.api.get(f"/v1/batches/{self.batch_id}/output", params=params)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/jsonl")
        got = [x for x in r.content.splitlines() if x]
        for x in got:
            assert json.loads(x)["custom_id"]
        self.lines += got
        if r.headers["inferq-complete"] == "false":
            self.while_running += len(got)
        self.downloads.append((r.headers["inferq-batch-status"],
                               int(r.headers["inferq-chunks"]), len(got)))
        self.cursor = r.headers["inferq-next-cursor"]
        return r


def test_partial_downloads_across_a_kill_9_hold_every_request_once(
        fstack: Any, fsdk: Any, workers: Any, fctx: Any, api: httpx2.Client) -> None:
    rows = [emb_line(i, f"partial results sentence {i} " * (1 + i % 4)) for i in range(800)]
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    reader = Reader(api, b.id)
    first = reader.download()  # nothing has run: no worker yet
    assert first.content == b"" and first.headers["inferq-complete"] == "false"

    k1 = workers("p1")
    deadline = time.monotonic() + 180
    while not any(s.chunks_done >= 2 and s.status == "running" for s in shards(fctx, b.id)):
        assert time.monotonic() < deadline, "no shard got two chunks in"
        reader.download()
        time.sleep(0.2)
    os.killpg(k1.pid, signal.SIGKILL)  # mid-shard: its chunk in flight is lost
    k1.wait()
    after_kill = reader.download()  # what was committed before the kill, and no more
    assert after_kill.headers["inferq-batch-status"] == "in_progress"
    committed = sum(s.chunks_done for s in shards(fctx, b.id))
    assert len(reader.lines) == sum(min(CHUNK * s.chunks_done, s.rows)
                                    for s in shards(fctx, b.id))
    assert reader.while_running >= 2 * CHUNK and committed >= 2

    workers("p2")
    deadline = time.monotonic() + 300
    while reader.download().headers["inferq-complete"] != "true":
        assert time.monotonic() < deadline, "the batch did not end"
        time.sleep(0.3)
    b = wait(fsdk, b.id, timeout=60)
    assert b.status == "completed" and b.request_counts.completed == 800
    last = reader.download()  # with the last cursor: nothing more, and it says so
    assert last.content == b"" and last.headers["inferq-chunks"] == "0"
    assert last.headers["inferq-complete"] == "true"

    ids = Counter(json.loads(x)["custom_id"] for x in reader.lines)
    assert set(ids) == {r["custom_id"] for r in rows}, "a request is missing"
    assert set(ids.values()) == {1}, "a request came twice"
    output = [x for x in fsdk.files.content(b.output_file_id).read().splitlines() if x]
    assert Counter(output) == Counter(reader.lines)  # the output file, line for line
    assert max(s.attempt for s in shards(fctx, b.id)) >= 2  # the kill did interrupt a shard
    assert sum(1 for st, chunks, _n in reader.downloads if st == "in_progress" and chunks) >= 1

    again = Reader(api, b.id)  # a reader that starts after the end gets it all at once
    again.download()
    assert Counter(again.lines) == Counter(output)
    errors = api.get(f"/v1/batches/{b.id}/output", params={"partial": "true", "kind": "errors"})
    assert errors.status_code == 200 and errors.content == b""  # no request failed


def test_bad_partial_requests_are_clear_client_errors(
        fstack: Any, fsdk: Any, api: httpx2.Client) -> None:
    rows = [emb_line(i, "x") for i in range(3)]
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    other = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                                endpoint="/v1/embeddings", completion_window="24h")
    try:
        path = f"/v1/batches/{b.id}/output"
        good = api.get(path, params={"partial": "true"})
        assert good.status_code == 200
        other_cursor = api.get(f"/v1/batches/{other.id}/output",
                               params={"partial": "true"}).headers["inferq-next-cursor"]
        cases = [
            ({}, "partial"),
            ({"partial": "false"}, "partial"),
            ({"partial": "true", "after": "garbage"}, "after"),
            ({"partial": "true", "after": "pc1.%%%"}, "after"),
            ({"partial": "true", "after": "pc1." + "A" * 3500}, "after"),  # over the cap
            ({"partial": "true", "after": other_cursor}, "after"),  # another batch's
            ({"partial": "true", "after": partial.encode_cursor(b.id, [99])}, "after"),
            ({"partial": "true", "after": partial.encode_cursor(b.id, [0] * 50)}, "after"),
            ({"partial": "true", "after": "pc1.\x00"}, "after"),
            ({"partial": "true", "kind": "everything"}, "kind"),
        ]
        for params, param in cases:
            r = api.get(path, params=params)
            assert r.status_code == 400, (params, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
            assert err["param"] == param, (params, err)
        missing = api.get("/v1/batches/batch_0123456789abcdef/output", params={"partial": "true"})
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "batch_id"
    finally:
        fsdk.batches.cancel(b.id)
        fsdk.batches.cancel(other.id)


def test_a_cursor_round_trips_and_stays_short() -> None:
    counts = [10] * 4000 + [3, 7, 1] + [0] * 996  # 5000 shards, as a big batch runs them
    cursor = partial.encode_cursor("batch_abc", counts)
    assert partial.decode_cursor(cursor, "batch_abc", 5000) == counts
    assert len(cursor) < 200
    assert partial.decode_cursor(partial.encode_cursor("batch_abc", []), "batch_abc", 9) == []
    with pytest.raises(InvalidRequest):
        partial.decode_cursor(cursor, "batch_other", 5000)
    with pytest.raises(InvalidRequest):  # more shards than the batch has
        partial.decode_cursor(cursor, "batch_abc", 10)
