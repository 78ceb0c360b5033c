"""Tracing setup and propagation (jobs/core/tracing.py) and JSON log lines (jobs/core/logs.py)."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from jobs.core import logs, tracing
from jobs.core.settings import Settings


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.setup(Settings(), "worker", exporter=exporter)
    yield exporter
    tracing.shutdown()


def _exporter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "Otel" in t.name or "Batch" in t.name]


def test_off_by_default_no_spans_no_exporter_thread() -> None:
    st = Settings()
    assert st.otel_exporter == "none"
    assert tracing.setup(st, "api") is False
    assert not tracing.enabled()
    with tracing.span("nothing") as s:
        assert s is None
    carrier: dict[str, str] = {}
    with tracing.producer("send", carrier):
        pass
    tracing.inject(carrier)
    assert carrier == {} and tracing.extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16
                                              + "-01"}) is None
    assert tracing.start("x") is None and tracing.current_ids() is None
    assert _exporter_threads() == []


def test_otlp_runs_its_exporter_on_a_thread_until_shutdown() -> None:
    st = Settings(otel_exporter="otlp", otel_endpoint="http://127.0.0.1:9/v1/traces")
    assert tracing.setup(st, "api")
    try:
        assert _exporter_threads(), "the OTLP exporter exports from a thread of its own"
    finally:
        tracing.shutdown()
    assert _exporter_threads() == [] and not tracing.enabled()


def test_context_crosses_a_message(memory: InMemorySpanExporter) -> None:
    msg: dict[str, object] = {"id": "req_1"}
    with tracing.span("POST /v1/x", SpanKind.SERVER), tracing.producer("send", msg):
        pass
    assert isinstance(msg["traceparent"], str)
    got = tracing.start("receive", SpanKind.CONSUMER, parent=msg)
    tracing.end(got, attributes={"n": 1, "skipped": None})
    by_name = {s.name: s for s in memory.get_finished_spans()}
    server, send, recv = by_name["POST /v1/x"], by_name["send"], by_name["receive"]
    assert send.kind == SpanKind.PRODUCER and recv.kind == SpanKind.CONSUMER
    assert {server.context.trace_id, send.context.trace_id} == {recv.context.trace_id}
    assert send.parent is not None and send.parent.span_id == server.context.span_id
    assert recv.parent is not None and recv.parent.span_id == send.context.span_id
    assert dict(recv.attributes or {}) == {"n": 1}
    assert server.resource.attributes["service.name"] == "inferq-worker"


def test_file_exporter_writes_json_lines_per_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert tracing.setup(Settings(otel_exporter="file", otel_endpoint=str(tmp_path)), "control")
    try:
        with tracing.span("a"), tracing.span("b"):
            pass
    finally:
        tracing.shutdown()
    (f,) = tmp_path.glob("inferq-control-*.jsonl")
    spans = [json.loads(x) for x in f.read_text().splitlines()]
    assert [s["name"] for s in spans] == ["b", "a"]
    assert spans[0]["parent_id"] == spans[1]["context"]["span_id"]


def _capture(settings: Settings) -> io.StringIO:
    buf = io.StringIO()
    logs.setup(settings)
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "inferq", False))
    handler.setStream(buf)  # type: ignore[attr-defined]
    return buf


def test_json_lines_carry_the_bound_ids_and_the_trace(memory: InMemorySpanExporter) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        buf = _capture(Settings(log_format="json"))
        log = logging.getLogger("inferq.test")
        with tracing.span("shard") as s, logs.bound(batch_id="batch_1", shard_id="batch_1.0"):
            logs.bind(project_id="proj_1")
            log.info("shard %s: %s", "batch_1.0", "completed")
        log.warning("after")
        first, after = (json.loads(x) for x in buf.getvalue().splitlines())
        assert s is not None
        ctx = s.get_span_context()
        assert first == {"ts": first["ts"], "level": "INFO", "logger": "inferq.test",
                         "msg": "shard batch_1.0: completed", "batch_id": "batch_1",
                         "shard_id": "batch_1.0", "project_id": "proj_1",
                         "trace_id": format(ctx.trace_id, "032x"),
                         "span_id": format(ctx.span_id, "016x")}
        assert first["ts"].endswith("+00:00")
        # outside the block: nothing bound there, no span current
        assert after == {"ts": after["ts"], "level": "WARNING", "logger": "inferq.test",
                         "msg": "after"}
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_text_format_keeps_other_handlers() -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    other = logging.StreamHandler(io.StringIO())
    root.addHandler(other)
    try:
        logs.setup(Settings(log_format="text"))
        assert other in root.handlers
        logs.setup(Settings(log_format="json"))
        assert root.handlers and all(getattr(h, "inferq", False) for h in root.handlers)
        assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)
    finally:
        root.handlers[:] = saved
