"""OpenTelemetry tracing: one trace per request, from the API's span through the queues
to the worker's engine and back.

Off by default (``INFERQ_OTEL_EXPORTER=none``): no tracer provider is built, no
exporter thread runs, and every helper here returns after one bool check. On, each
process (``api``, ``worker``, ``control``) has its own provider named
``<INFERQ_OTEL_SERVICE_NAME>-<kind>`` and exporter:

- ``otlp``: OTLP over HTTP to ``INFERQ_OTEL_ENDPOINT`` (batched on a thread);
- ``console``: spans printed on stderr;
- ``file``: a debugging exporter, each process appending its finished spans as JSON
  lines to ``<INFERQ_OTEL_ENDPOINT>/<service>-<pid>.jsonl``.

The trace context crosses the queues as a W3C ``traceparent`` entry: in the headers
of the Celery messages ``jobs/core/dispatch.py`` sends, and in the realtime lane's
request dicts (``jobs/realtime/client.py``). The sender opens a PRODUCER span and injects
its context; the receiver opens a CONSUMER span whose parent is the extracted one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context as OtelContext
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from jobs.core.settings import Settings

TRACEPARENT = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP: trace.Tracer = trace.NoOpTracer()


class _State:
    enabled = False
    tracer: trace.Tracer = _NOOP
    provider: TracerProvider | None = None


_state = _State()


def enabled() -> bool:
    return _state.enabled


def service_name(settings: Settings, kind: str) -> str:
    return f"{settings.otel_service_name}-{kind}"


def setup(settings: Settings, kind: str, exporter: SpanExporter | None = None) -> bool:
    """Build this process's tracer from settings (``exporter``: one given by a test, e.g.
    an in-memory one, used whatever the setting says). True when tracing is on."""
    if exporter is None and settings.otel_exporter == "none":
        shutdown()
        return False
    shutdown()
    name = service_name(settings, kind)
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.otel_endpoint or None)))
    elif settings.otel_exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:  # file
        provider.add_span_processor(SimpleSpanProcessor(
            JsonLinesExporter(Path(settings.otel_endpoint or "."), name)))
    _state.provider, _state.tracer, _state.enabled = provider, provider.get_tracer("inferq"), True
    return True


def shutdown() -> None:
    """Flush and stop this process's tracer; tracing is off afterwards."""
    provider, _state.provider = _state.provider, None
    _state.enabled, _state.tracer = False, _NOOP
    if provider is not None:
        provider.shutdown()


def inject(carrier: MutableMapping[str, Any]) -> None:
    """Write the current trace context (``traceparent``) into ``carrier``."""
    if _state.enabled:
        _PROPAGATOR.inject(carrier)


def extract(carrier: Mapping[str, Any] | None) -> OtelContext | None:
    """The trace context a message carries, or None."""
    if not _state.enabled or not carrier or not isinstance(carrier.get(TRACEPARENT), str):
        return None
    return _PROPAGATOR.extract(carrier)


def start(name: str, kind: SpanKind = SpanKind.INTERNAL,
          parent: Mapping[str, Any] | OtelContext | None = None,
          attributes: Mapping[str, Any] | None = None) -> Span | None:
    """A span that the caller ends (it outlives the call: a stream, an async answer),
    child of ``parent``: a context, or a carrier (a message; one that carries no trace
    context starts a new trace); the current span if None. None when tracing is off."""
    if not _state.enabled:
        return None
    ctx = parent if isinstance(parent, OtelContext) or parent is None else _parent_of(parent)
    return _state.tracer.start_span(name, context=ctx, kind=kind,
                                    attributes=_clean(attributes))


def child(parent: Span | None, name: str,
          attributes: Mapping[str, Any] | None = None) -> Span | None:
    """A span under ``parent`` that the caller ends; None when ``parent`` is None."""
    if parent is None or not _state.enabled:
        return None
    return start(name, parent=trace.set_span_in_context(parent), attributes=attributes)


@contextmanager
def span(name: str, kind: SpanKind = SpanKind.INTERNAL,
         parent: Mapping[str, Any] | None = None,
         attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A span current for the block: child of the caller's current span, or of the
    context the carrier ``parent`` carries (none: a new trace); yields None when
    tracing is off."""
    if not _state.enabled:
        yield None
        return
    ctx = _parent_of(parent) if parent is not None else None
    with _state.tracer.start_as_current_span(name, context=ctx, kind=kind,
                                             attributes=_clean(attributes)) as s:
        yield s


@contextmanager
def producer(name: str, carrier: MutableMapping[str, Any],
             attributes: Mapping[str, Any] | None = None) -> Iterator[None]:
    """The send of one message: a PRODUCER span whose context ``carrier`` takes."""
    if not _state.enabled:
        yield
        return
    with span(name, SpanKind.PRODUCER, attributes=attributes):
        inject(carrier)
        yield


def attach(s: Span | None) -> object | None:
    """Make ``s`` current until :func:`detach` (across a framework's before/after hooks)."""
    if s is None:
        return None
    return otel_context.attach(trace.set_span_in_context(s))


def detach(token: object | None) -> None:
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]


def use(s: Span | None) -> Any:
    """Make ``s`` current for a block (a no-op block for None)."""
    if s is None:
        return _Nothing()
    return trace.use_span(s, end_on_exit=False)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def end(s: Span | None, error: BaseException | str | None = None,
        attributes: Mapping[str, Any] | None = None) -> None:
    """End ``s`` (None: tracing is off), marked as an error if ``error``."""
    if s is None:
        return
    if attributes:
        s.set_attributes(_clean(attributes) or {})
    if error is not None:
        s.set_status(Status(StatusCode.ERROR, str(error)))
        if isinstance(error, BaseException):
            s.record_exception(error)
    s.end()


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set attributes on the current span (nothing when tracing is off)."""
    if _state.enabled:
        trace.get_current_span().set_attributes(_clean(attributes) or {})


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, in hex; None when there is none."""
    if not _state.enabled:
        return None
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return format(sc.trace_id, "032x"), format(sc.span_id, "016x")


def _parent_of(carrier: Mapping[str, Any]) -> OtelContext:
    """The context a message carries, or an empty one (its span is a trace's root)."""
    return extract(carrier) or OtelContext()


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Attributes without the None values OpenTelemetry refuses."""
    if not attributes:
        return None
    return {k: v for k, v in attributes.items() if v is not None}


class JsonLinesExporter(SpanExporter):
    """The ``file`` exporter: every finished span as one JSON line (debugging, tests)."""

    def __init__(self, directory: Path, service: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{service}-{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(s.to_json(indent=None) + "\n" for s in spans)
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
