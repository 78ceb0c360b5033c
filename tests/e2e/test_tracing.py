"""One trace per request across processes: a stack of its own (API under gunicorn, the
control worker, a model worker) with the ``file`` span exporter, so each process's
finished spans land as JSON lines in one directory, and JSON logs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs.core.context import Context
from jobs.core.schema import Batch
from jobs.fleet import heartbeats
from tests.conftest import AWS_ENV, free_port, fresh_database
from tests.helpers import emb_line, held_models, jsonl, upload, wait

pytestmark = pytest.mark.slow
CHAT_MODEL = "SmolLM2-135M-Instruct"


class Traced:
    def __init__(self, stack: Any, spans_dir: Path) -> None:
        self.stack, self.spans_dir = stack, spans_dir

    def spans(self) -> list[dict[str, Any]]:
        out = []
        for f in sorted(self.spans_dir.glob("*.jsonl")):
            out += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        return out

    def trace_of_request(self, request_id: str) -> str:
        """The trace id of the API's SERVER span for the request ``request_id``."""
        for s in self.wait_spans(lambda ss: any(
                _attr(x, "inferq.request_id") == request_id for x in ss)):
            if _attr(s, "inferq.request_id") == request_id:
                assert s["kind"] == "SpanKind.SERVER"
                return str(s["context"]["trace_id"])
        raise AssertionError("unreachable")

    def wait_spans(self, ok: Any, timeout: float = 30) -> list[dict[str, Any]]:
        """Spans are written when they end (the worker's shard span after its finalize
        is sent): poll until ``ok(spans)``."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if ok(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans never matched; have {[_brief(s) for s in spans]}")
            time.sleep(0.2)


def shard_id_of(batch_id: str, index: int) -> str:
    return f"{batch_id}.{index:06d}"  # as validation names shards


def _attr(s: dict[str, Any], k: str) -> Any:
    return (s.get("attributes") or {}).get(k)


def _service(s: dict[str, Any]) -> str:
    return str(s["resource"]["attributes"]["service.name"])


def _brief(s: dict[str, Any]) -> str:
    return f"{_service(s)}:{s['name']}:{s['kind']}"


def _one(spans: list[dict[str, Any]], **want: str) -> dict[str, Any]:
    found = [s for s in spans if all(
        (_service(s) if k == "service" else s[k]) == v for k, v in want.items())]
    assert len(found) == 1, (want, [_brief(s) for s in spans])
    return found[0]


@pytest.fixture(scope="module")
def traced(settings, pg_admin_url, redis_dbs, s3_endpoint, tmp_path_factory
           ) -> Iterator[Traced]:  # type: ignore[no-untyped-def]
    from cli.stack import Stack

    spans_dir = tmp_path_factory.mktemp("spans")
    with fresh_database(pg_admin_url) as db, redis_dbs.lend() as redis_url:
        st = settings.model_copy(update={
            "database_url": db, "redis_url": redis_url, "otel_exporter": "file",
            "otel_endpoint": str(spans_dir), "log_format": "json", "chat_model": CHAT_MODEL})
        stack = Stack(st, port=free_port(), extra_env={**AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint},
                      log_dir=tmp_path_factory.mktemp("tlogs"))
        stack.start()
        try:
            yield Traced(stack, spans_dir)
        finally:
            stack.stop()


@pytest.fixture(scope="module")
def tsdk(traced: Traced):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=traced.stack.base_url + "/v1", api_key=traced.stack.api_key,
                  max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def batch_run(traced: Traced, tsdk: Any) -> tuple[Any, str]:
    f = upload(tsdk, jsonl([emb_line(i, f"trace me {i}") for i in range(5)]))
    raw = tsdk.batches.with_raw_response.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                                completion_window="24h")
    b = raw.parse()
    assert wait(tsdk, b.id, timeout=240).status == "completed"
    return b, traced.trace_of_request(raw.headers["x-request-id"])


def test_one_trace_holds_a_batch_from_create_to_its_shard(traced: Traced,
                                                          batch_run: tuple[Any, str]) -> None:
    b, trace_id = batch_run
    shard_id = shard_id_of(b.id, 0)

    def complete(spans: list[dict[str, Any]]) -> bool:
        return any(s["name"] == "run inferq.process_shard" and s["context"]["trace_id"] ==
                   trace_id for s in spans)

    spans = [s for s in traced.wait_spans(complete) if s["context"]["trace_id"] == trace_id]
    api = _one(spans, name="POST /v1/batches", service="inferq-api")
    assert api["parent_id"] is None and _attr(api, "http.response.status_code") == 200
    # API → control worker: the send's PRODUCER span is the validate task's parent
    send_v = _one(spans, name="send inferq.validate_batch", kind="SpanKind.PRODUCER")
    run_v = _one(spans, name="run inferq.validate_batch", kind="SpanKind.CONSUMER",
                 service="inferq-control")
    assert send_v["parent_id"] == api["context"]["span_id"]
    assert run_v["parent_id"] == send_v["context"]["span_id"]
    assert _attr(run_v, "inferq.batch_id") == b.id
    # control worker → model worker: validation's fair dispatch sends the shard
    send_s = _one(spans, name="send inferq.process_shard", kind="SpanKind.PRODUCER",
                  service="inferq-control")
    run_s = _one(spans, name="run inferq.process_shard", kind="SpanKind.CONSUMER",
                 service="inferq-worker")
    assert send_s["parent_id"] == run_v["context"]["span_id"]
    assert run_s["parent_id"] == send_s["context"]["span_id"]
    assert _attr(run_s, "inferq.shard_id") == shard_id
    assert _attr(run_s, "inferq.outcome") == "done"
    assert _attr(run_s, "inferq.project_id") == _attr(api, "inferq.project_id") != ""
    # and the last shard sends the finalize, still in the batch's trace
    run_f = _one(spans, name="run inferq.finalize_batch", service="inferq-control")
    assert _one(spans, name="send inferq.finalize_batch", service="inferq-worker"
                )["context"]["span_id"] == run_f["parent_id"]


def test_worker_log_lines_of_a_shard_carry_its_ids(traced: Traced,
                                                   batch_run: tuple[Any, str]) -> None:
    b, trace_id = batch_run
    ctx = Context(traced.stack.settings)
    try:
        with ctx.db.session() as s:
            project = s.get(Batch, b.id).tenant_id  # type: ignore[union-attr]
    finally:
        ctx.close()
    log = traced.stack.log_dir / "worker-gpu0.log"
    records = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    mine = [r for r in records if r.get("shard_id") == shard_id_of(b.id, 0)]
    assert mine, f"no log line of the shard in {log}"
    done = [r for r in mine if r["msg"] == f"shard {shard_id_of(b.id, 0)}: done"]
    assert len(done) == 1
    r = done[0]
    assert set(r) >= {"ts", "level", "logger", "msg", "span_id"}
    assert (r["batch_id"], r["project_id"], r["trace_id"]) == (b.id, project, trace_id[2:])
    assert r["level"] == "INFO" and r["logger"] == "inferq.batch_lane"


def test_one_trace_holds_a_stream_from_the_api_to_the_engine_steps(traced: Traced,
                                                                    tsdk: Any) -> None:
    raw = tsdk.chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Say hello."}],
        temperature=0, max_tokens=6, stream=True)
    chunks = list(raw.parse())
    assert chunks and any(c.choices and c.choices[0].delta.content for c in chunks)
    trace_id = traced.trace_of_request(raw.headers["x-request-id"])

    def complete(spans: list[dict[str, Any]]) -> bool:
        return any(s["name"] == "realtime /v1/chat/completions" and
                   s["context"]["trace_id"] == trace_id for s in spans)

    spans = [s for s in traced.wait_spans(complete) if s["context"]["trace_id"] == trace_id]
    api = _one(spans, name="POST /v1/chat/completions", service="inferq-api")
    send = _one(spans, name="realtime send /v1/chat/completions", kind="SpanKind.PRODUCER",
                service="inferq-api")
    req = _one(spans, name="realtime /v1/chat/completions", kind="SpanKind.CONSUMER",
               service="inferq-worker")
    prefill = _one(spans, name="engine prefill", service="inferq-worker")
    decode = _one(spans, name="engine decode", service="inferq-worker")
    assert send["parent_id"] == api["context"]["span_id"]
    assert req["parent_id"] == send["context"]["span_id"]
    assert prefill["parent_id"] == decode["parent_id"] == req["context"]["span_id"]
    assert 1 <= _attr(req, "gen_ai.usage.output_tokens") <= 6
    assert _attr(req, "inferq.finish_reason") in ("stop", "length")
    assert _attr(decode, "inferq.decode_steps") == _attr(req, "gen_ai.usage.output_tokens") - 1
    events = {e["name"]: e["timestamp"] for e in req["events"]}
    assert set(events) >= {"engine.admitted", "first_token"}
    # the API's span ends with the stream: after the worker's first token was sent
    assert api["end_time"] > events["first_token"]
    assert api["start_time"] < req["start_time"]


def test_a_realtime_request_in_process_is_one_trace(own_redis_url: str, minilm: Any,
                                                     minilm_engine: Any) -> None:
    """The API side and the worker's lane in this process, an in-memory exporter: the
    realtime message carries the send's context to the lane's span, which ends once
    the answer is sent."""
    import redis as redis_lib
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from jobs.core import logs, tracing
    from jobs.core.errors import InferqError
    from jobs.core.settings import Settings
    from jobs.realtime.client import RealtimeClient
    from workers.lanes.realtime import RealtimeConsumer

    exporter = InMemorySpanExporter()
    assert tracing.setup(Settings(), "api", exporter=exporter)
    r = redis_lib.Redis.from_url(own_redis_url)
    lane = RealtimeConsumer(r, held_models(((minilm, minilm_engine),)), 100,
                            allow=lambda: True)
    lane.start()
    heartbeats.write(r, "w", {"name": "w", "lanes": ["realtime"],
                                "models": ["all-MiniLM-L6-v2"]}, 60)
    try:
        with tracing.span("POST /v1/embeddings", SpanKind.SERVER), \
                logs.bound(request_id="req_traced", project_id="proj_t"):
            body = RealtimeClient(r, tenant_id=None).call(
                "embeddings", {"model": "all-MiniLM-L6-v2", "input": ["one", "two"]}, 20)
            # a refused request: answered, and its span ends as an error
            with pytest.raises(InferqError):
                RealtimeClient(r).call("embeddings", {"model": "all-MiniLM-L6-v2", "input": []},
                                       20)
        assert len(json.loads(body)["data"]) == 2
        deadline = time.monotonic() + 10
        while sum(s.name == "realtime embeddings" for s in exporter.get_finished_spans()) < 2:
            assert time.monotonic() < deadline, [s.name for s in exporter.get_finished_spans()]
            time.sleep(0.05)
    finally:
        lane.stop()
        r.close()
        tracing.shutdown()
    spans = exporter.get_finished_spans()
    api = next(s for s in spans if s.name == "POST /v1/embeddings")
    sends = [s for s in spans if s.name == "realtime send embeddings"]
    recvs = [s for s in spans if s.name == "realtime embeddings"]
    assert len(sends) == len(recvs) == 2
    assert {s.context.trace_id for s in spans} == {api.context.trace_id}
    for send in sends:
        assert send.kind == SpanKind.PRODUCER and send.parent is not None
        assert send.parent.span_id == api.context.span_id
    by_parent = {s.parent.span_id: s for s in recvs if s.parent is not None}
    assert set(by_parent) == {s.context.span_id for s in sends}
    ok, refused = sorted(recvs, key=lambda s: s.status.is_ok, reverse=True)
    assert ok.kind == SpanKind.CONSUMER and (ok.attributes or {})["inferq.inputs"] == 2
    assert (ok.attributes or {})["gen_ai.usage.input_tokens"] > 2
    assert not refused.status.is_ok
