"""``GET /v1/batches/{id}/events``: a batch's status changes and counts as Server-Sent
Events, resumable with Last-Event-ID.

The first tests drive a batch's rows by hand on a database of their own (the
fenced checkpoint and the cancel use case are the real ones) and read the stream
through the Flask app, one frame at a time, so every step is seen; the last ones
run a real batch of several shards on the session stack and read its stream over
HTTP, dropping the connection mid-way."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from jobs.batches import progress, service
from jobs.batches import queries as repo
from jobs.batches.outputs import Tokens
from jobs.core.context import Context
from jobs.core.schema import Batch, File, Shard, new_id, now
from jobs.core.settings import Settings
from jobs.tenants import auth
from tests.helpers import emb_line, jsonl, upload, wait


@dataclass
class Frame:
    """One frame of a text/event-stream: an event (id, event, data), a comment or a
    ``retry:`` field."""

    id: str | None = None
    event: str | None = None
    data: dict[str, Any] | None = None
    comment: str | None = None
    retry: int | None = None


def frame(raw: str) -> Frame:
    f = Frame()
    assert raw.endswith("\n\n"), raw
    for line in raw[:-2].split("\n"):
        name, _, value = line.partition(": ")
        if name == "":
            f.comment = value
        elif name == "retry":
            f.retry = int(value)
        elif name == "id":
            f.id = value
        elif name == "event":
            f.event = value
        else:
            assert name == "data", raw
            f.data = json.loads(value)
    if f.event is not None:
        assert f.id is not None and f.data is not None, raw
    return f


def frames(text: str) -> list[Frame]:
    return [frame(part + "\n\n") for part in text.split("\n\n") if part]


def events_only(fs: list[Frame]) -> list[Frame]:
    return [f for f in fs if f.event is not None]


def check_event(f: Frame, batch_id: str) -> None:
    """Every field of an event's data, as docs/API.md describes it."""
    d = f.data
    assert d is not None
    assert set(d) == {"object", "batch_id", "status", "created_at", "request_counts", "usage"}
    assert d["object"] == "batch.progress" and d["batch_id"] == batch_id
    assert f.event in ("status", "progress") and isinstance(d["created_at"], int)
    assert set(d["request_counts"]) == {"total", "completed", "failed"}
    assert set(d["usage"]) == {"input_tokens", "input_tokens_details", "output_tokens",
                               "output_tokens_details", "total_tokens"}
    rc = d["request_counts"]
    assert f.id == f"{progress.RANK[d['status']]}-{rc['completed'] + rc['failed']}"


def position(f: Frame) -> tuple[int, int]:
    rank, done = (f.id or "").split("-")
    return int(rank), int(done)


# The stream's mechanics, step by step, on a database of this test's own -----------------


@dataclass
class Own:
    app: Any
    ctx: Context
    tenant_id: str
    key: str
    other_key: str

    def client(self, key: str | None = None) -> Any:
        c = self.app.test_client()
        c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key or self.key}"
        return c

    def batch(self, rows: int = 100) -> tuple[str, str]:
        """A batch (validating) with one shard of ``rows`` requests: (batch id, shard id)."""
        with self.ctx.db.session() as s:
            f = File(id=new_id("file-"), tenant_id=self.tenant_id, filename="in.jsonl",
                     purpose="batch", format="jsonl", bytes=1, object_key="files/x")
            s.add(f)
            s.flush()
            b = Batch(id=new_id("batch_"), tenant_id=self.tenant_id, endpoint="/v1/embeddings",
                      input_file_id=f.id, completion_window="24h", status="validating",
                      defaults={}, created_at=now(), expires_at=now() + 86400)
            s.add(b)
            s.flush()
            s.add(Shard(id=f"{b.id}.000000", batch_id=b.id, index=0, rows=rows,
                        object_key="shards/x", dispatched_at=time.time()))
        return b.id, f"{b.id}.000000"

    def set(self, batch_id: str, **values: Any) -> None:
        with self.ctx.db.session() as s:
            b = repo.get_batch(s, None, batch_id, lock=True)
            assert b is not None
            for k, v in values.items():
                setattr(b, k, v)


@pytest.fixture
def own(own_settings: Settings) -> Iterator[Own]:
    from api.app import create_app

    st = own_settings.model_copy(update={"events_poll_s": 0.02, "events_keepalive_s": 0.4,
                                         "events_max_s": 60.0})
    app = create_app(st)
    ctx: Context = app.extensions["inferq"]
    tenant_id, key = auth.create_tenant(ctx, f"events-{secrets.token_hex(3)}")
    _, other_key = auth.create_tenant(ctx, f"others-{secrets.token_hex(3)}")
    yield Own(app, ctx, tenant_id, key, other_key)
    ctx.close()


class Reader:
    """A stream read through the Flask app one frame at a time (each chunk the view
    yields is one frame): the test changes the batch between two reads."""

    def __init__(self, own: Own, batch_id: str, last_event_id: str | None = None) -> None:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self.resp = own.client().get(f"/v1/batches/{batch_id}/events", headers=headers,
                                     buffered=False)
        self.chunks = iter(self.resp.response)

    def next(self) -> Frame | None:
        """The next frame; None once the stream has ended."""
        chunk = next(self.chunks, None)
        return None if chunk is None else frame(chunk.decode())

    def next_event(self) -> Frame:
        while (f := self.next()) is not None:
            if f.event is not None:
                return f
        raise AssertionError("the stream ended")

    def rest(self) -> list[Frame]:
        out = []
        while (f := self.next()) is not None:
            out.append(f)
        return out


def test_a_poll_reads_a_batch_and_its_shards_as_of_one_moment(own: Own) -> None:
    """Finalize commits a shard's last counts and the batch's terminal status together;
    a poll that reads the batch row and then the shards' sums sees both or neither, even
    when that commit lands between its two reads (under READ COMMITTED the second read
    would see the new counts beside the old status: a progress event too many)."""
    batch_id, shard_id = own.batch(rows=100)
    key = (own.tenant_id, batch_id)
    with own.ctx.db.snapshot() as s:
        (b,) = repo.get_batches(s, [batch_id])
        with own.ctx.db.session() as w:  # finalize, between the poll's two reads
            sh = w.get(Shard, shard_id)
            assert sh is not None
            sh.status, sh.failed = "cancelled", 100
            wb = repo.get_batch(w, None, batch_id, lock=True)
            assert wb is not None
            wb.status, wb.cancelled_at = "cancelled", now()
        sums = repo.shard_sums(s, [batch_id])
    assert b.status == "validating" and sums[batch_id].failed == 0
    after = progress.read_many(own.ctx, [key])[key]
    assert (after.status, after.done) == ("cancelled", 100)


def test_a_stream_follows_the_batch_step_by_step(own: Own) -> None:
    batch_id, shard_id = own.batch(rows=100)
    r = Reader(own, batch_id)
    assert r.resp.status_code == 200 and r.resp.mimetype == "text/event-stream"
    assert r.resp.headers["Cache-Control"] == "no-cache"
    first = r.next()
    assert first is not None and first.retry == 1000  # a reconnect waits a second
    seen = [r.next_event()]
    assert (seen[0].event, seen[0].id, seen[0].data["status"]) == (  # type: ignore[index]
        "status", "0-0", "validating")
    pool = own.ctx.db.engine.pool
    assert pool.checkedout() == 0  # type: ignore[attr-defined]  # none held between polls

    # nothing changes: a keep-alive comment, about every events_keepalive_s
    t = time.monotonic()
    assert r.next() == Frame(comment="keep-alive")
    assert time.monotonic() - t >= 0.3

    own.set(batch_id, status="in_progress", in_progress_at=now(), total=103, invalid=3)
    seen.append(r.next_event())
    with own.ctx.db.session() as s:
        sh = repo.claim_shard(s, shard_id, "tok", "w1", 60)
        assert sh is not None
    for n, (ok, bad) in enumerate([(38, 2), (30, 0)], start=1):
        with own.ctx.db.session() as s:
            assert repo.checkpoint(s, shard_id, "tok", 1, n, ok + bad, ok, bad,
                                   Tokens(prompt=7 * ok), 60)
        seen.append(r.next_event())
        assert pool.checkedout() == 0  # type: ignore[attr-defined]
    service.cancel_batch(own.ctx, own.tenant_id, batch_id)  # the shard is running: no finalize
    seen.append(r.next_event())
    # What finalize does when the shard has stopped, in one transaction: the stream's
    # poll sees both or neither (two writes would let a poll between them see the
    # counts move under "cancelling", one event more than this test expects).
    with own.ctx.db.session() as s:
        sh = s.get(Shard, shard_id)
        assert sh is not None
        sh.status, sh.failed = "cancelled", sh.failed + 30
        b = repo.get_batch(s, None, batch_id, lock=True)
        assert b is not None
        b.status, b.cancelled_at = "cancelled", now()
    seen.append(r.next_event())
    assert r.next() is None  # the stream ends after the terminal status

    assert [(f.event, f.id, f.data["status"]) for f in seen] == [  # type: ignore[index]
        ("status", "0-0", "validating"), ("status", "1-3", "in_progress"),
        ("progress", "1-43", "in_progress"), ("progress", "1-73", "in_progress"),
        ("status", "2-73", "cancelling"), ("status", "4-103", "cancelled")]
    for f in seen:
        check_event(f, batch_id)
    last = seen[-1].data
    assert last is not None
    assert last["request_counts"] == {"total": 103, "completed": 68, "failed": 35}
    assert last["usage"]["input_tokens"] == 7 * 68

    # Resuming: from the end nothing is left (204: an EventSource stops reconnecting);
    # from mid-way every status since, with the latest counts; from nothing, the whole
    # path.
    done = own.client().get(f"/v1/batches/{batch_id}/events", headers={"Last-Event-ID": "4-103"})
    assert done.status_code == 204 and done.get_data() == b""
    again = events_only(Reader(own, batch_id, "1-43").rest())
    assert [(f.event, f.id, f.data["status"]) for f in again] == [  # type: ignore[index]
        ("status", "2-103", "cancelling"), ("status", "4-103", "cancelled")]
    whole = events_only(Reader(own, batch_id).rest())
    assert [f.data["status"] for f in whole] == [  # type: ignore[index]
        "validating", "in_progress", "cancelling", "cancelled"]
    assert {f.data["request_counts"]["failed"] for f in whole} == {35}  # type: ignore[index]


def test_a_stream_ends_at_its_time_limit_and_resumes(own: Own) -> None:
    own.app.extensions["inferq"].settings = own.ctx.settings.model_copy(
        update={"events_max_s": 0.3})
    batch_id, _ = own.batch()
    own.set(batch_id, status="in_progress", in_progress_at=now(), total=100)
    t = time.monotonic()
    fs = Reader(own, batch_id).rest()
    assert time.monotonic() - t < 5
    got = events_only(fs)
    assert [f.data["status"] for f in got] == ["validating", "in_progress"]  # type: ignore[index]
    # resumed from its last id: nothing again until something changes
    r = Reader(own, batch_id, got[-1].id)
    own.set(batch_id, status="failed", failed_at=now())
    assert [(f.event, f.id) for f in events_only(r.rest())] == [("status", "4-0")]


def test_refused_before_any_event(own: Own) -> None:
    batch_id, _ = own.batch()
    theirs = own.client(own.other_key).get(f"/v1/batches/{batch_id}/events")
    assert theirs.status_code == 404 and theirs.mimetype == "application/json"
    assert theirs.get_json()["error"]["param"] == "batch_id"
    for bad, why in (("x", "must be the id"), ("1-5", "not an event of this batch"),
                     ("0-01", "must be the id")):
        resp = own.client().get(f"/v1/batches/{batch_id}/events",
                                headers={"Last-Event-ID": bad})
        assert resp.status_code == 400 and resp.mimetype == "application/json", bad
        err = resp.get_json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["param"] == "Last-Event-ID" and why in err["message"]


# A real batch on the session stack ------------------------------------------------------


def read_stream(base_url: str, key: str, batch_id: str, last_event_id: str | None = None,
                stop_after: int | None = None, timeout: float = 300) -> list[Frame]:
    """The stream's frames over HTTP until it ends (or ``stop_after`` events: then the
    connection is dropped)."""
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    out: list[Frame] = []
    deadline = time.monotonic() + timeout
    with httpx2.stream("GET", f"{base_url}/v1/batches/{batch_id}/events", headers=headers,
                       timeout=httpx2.Timeout(60, connect=10)) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        buf = ""
        for text in resp.iter_text():
            buf += text
            while "\n\n" in buf:
                raw, buf = buf.split("\n\n", 1)
                out.append(frame(raw + "\n\n"))
                if stop_after is not None and len(events_only(out)) >= stop_after:
                    return out
            assert time.monotonic() < deadline, "the stream did not end"
        assert buf == ""
    return out


def test_a_real_batch_streams_in_order_and_resumes_after_a_drop(stack: Any, sdk: Any,
                                                                tenant_key: str) -> None:
    n = 2000  # 5 shards of 400 rows, checkpointed every 100
    f = upload(sdk, jsonl([emb_line(i, f"progress line {i} " * (1 + i % 5)) for i in range(n)]))
    b = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h")
    base = stack.base_url
    # One reader follows it all along; another drops after its first event and resumes.
    whole: list[Frame] = []
    t = threading.Thread(target=lambda: whole.extend(read_stream(base, tenant_key, b.id)))
    t.start()
    before = events_only(read_stream(base, tenant_key, b.id, stop_after=1))
    assert before[0].data["status"] not in ("completed", "failed")  # type: ignore[index]
    time.sleep(3)  # changes it misses while away
    after = events_only(read_stream(base, tenant_key, b.id, last_event_id=before[-1].id))
    t.join(300)
    assert not t.is_alive()
    final = sdk.batches.retrieve(b.id)
    assert final.status == "completed" and final.request_counts.completed == n

    for evs in (events_only(whole), before + after):
        for ev in evs:
            check_event(ev, b.id)
        positions = [position(ev) for ev in evs]
        assert positions == sorted(set(positions))  # ids strictly increase
        done = [p[1] for p in positions]
        assert done == sorted(done)  # counts never go back
        statuses = [ev.data["status"] for ev in evs if ev.event == "status"]  # type: ignore[index]
        assert statuses == ["validating", "in_progress", "finalizing", "completed"]
        last = evs[-1].data
        assert last is not None and evs[-1].event == "status"
        assert last["request_counts"] == final.request_counts.model_dump()
        assert last["usage"]["input_tokens"] == final.usage.input_tokens > 0
    live = events_only(whole)
    assert len({position(ev)[1] for ev in live}) >= 2, [ev.id for ev in live]
    # read again once it has ended: the whole path, at the final counts, then the end
    replay = events_only(read_stream(base, tenant_key, b.id))
    assert [(ev.event, ev.data["status"]) for ev in replay] == [  # type: ignore[index]
        ("status", s) for s in ("validating", "in_progress", "finalizing", "completed")]
    assert {position(ev)[1] for ev in replay} == {n}
    gone = httpx2.get(f"{base}/v1/batches/{b.id}/events", timeout=30, headers={
        "Authorization": f"Bearer {tenant_key}", "Last-Event-ID": replay[-1].id or ""})
    assert gone.status_code == 204


def test_another_projects_batch_is_not_found(stack: Any, sdk: Any,
                                             other_tenant_key: str) -> None:
    f = upload(sdk, jsonl([emb_line(0, "mine")]))
    b = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h")
    resp = httpx2.get(f"{stack.base_url}/v1/batches/{b.id}/events", timeout=30,
                      headers={"Authorization": f"Bearer {other_tenant_key}"})
    assert resp.status_code == 404 and resp.headers["content-type"] == "application/json"
    assert resp.json()["error"]["message"] == f"No such Batch object: {b.id}"
    wait(sdk, b.id)
