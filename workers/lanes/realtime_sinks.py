"""The sinks of the realtime lane's token streams: ``MeteredSink`` (usage recorded when
the stream ends, or when its client went away), ``ServicedSink`` (its service also
reported to the admission model) and ``TracedSink`` (the request's trace, when tracing
is on).

A request of several choices or with log probabilities (``GenRequest.fans``) streams
its choices' pieces as ``delta`` events that also carry the chunk's ``choices`` (each
with its ``index`` and the ``logprobs`` of its tokens; a choice's end is one more such
event), and its ``done`` event says ``chunked``; unstreamed, the ``done`` event carries
the answer's ``choices`` whole (workers.engines.responses). A ``delta`` event's ``text`` is
there either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Span

from jobs.core import lanes, tracing
from jobs.core.status import StreamEvent
from jobs.slo import service_rates
from jobs.tenants import usage
from workers.engines.request import GenRequest
from workers.engines.responses import Choice, TokenLogprob, chunk_choice, generation_choices
from workers.engines.sinks import FinishReason, Usage
from workers.lanes.streams import CancelListener, Publisher, PubSink
from workers.lanes.usage_writer import UsageWriter
from workers.process import metrics


def enqueued_at(msg: dict[str, Any]) -> float | None:
    """When the API pushed ``msg`` (wall clock), if it says."""
    at = msg.get("enqueued_at")
    return float(at) if isinstance(at, int | float) else None


class MeteredSink(PubSink):
    """A token stream whose usage is recorded when it ends, or when its client went
    away (what was generated until then). ``on_end``: called once, at its last event or
    when it is dropped."""

    def __init__(self, publisher: Publisher, msg: dict[str, Any], cancels: CancelListener,
                 meter: UsageWriter | None, on_end: Callable[[], None] | None = None) -> None:
        super().__init__(publisher, msg["id"], cancels, on_end)
        self.msg, self.meter = msg, meter
        self.model, self.enqueued_at = str(msg["body"].get("model", "")), enqueued_at(msg)
        self.timer = metrics.StreamTimer(lanes.REALTIME, self.model, self.enqueued_at,
                                         time.time)
        self.kind = str(msg.get("kind"))
        self.streamed = bool(msg["body"].get("stream"))
        self.top: int | None = None  # alternatives per token (set by ``shape``)
        self.choices: list[Choice] | None = None  # a request that fans out: its choices

    def shape(self, req: GenRequest) -> None:
        """The request it answers, once built: whether (and how) it fans out."""
        self.top = req.logprobs
        if req.fans():
            self.choices = [Choice(i) for i in range(req.n)]

    def start(self) -> None:
        """Admitted to the engine: the end of its queue time."""
        if self.enqueued_at is not None:
            metrics.observe_queue(lanes.REALTIME, self.model, time.time() - self.enqueued_at)
        super().start()

    def delta(self, text: str) -> None:
        self.timer.delta()
        super().delta(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        """Part of a choice: one delta event (its chunk's choice when streamed)."""
        self.timer.delta()
        assert self.choices is not None
        c = self.choices[index]
        first = not c.parts
        c.add(text, tokens)
        ev: dict[str, Any] = {"t": StreamEvent.DELTA, "text": text, "index": index}
        if self.streamed:
            ev["choices"] = [chunk_choice(self.kind, index, text, tokens, self.top,
                                          role=first and index > 0)]
        self._send(ev)

    def choice_end(self, index: int, reason: str) -> None:
        assert self.choices is not None
        c = self.choices[index]
        c.reason = reason
        if self.streamed:
            self._send({"t": StreamEvent.DELTA, "text": "", "index": index, "choices": [
                chunk_choice(self.kind, index, "", None, self.top, finish=reason,
                             role=not c.parts and index > 0)]})

    def finish(self, reason: FinishReason, u: Usage) -> None:
        if self.ended:  # already ended here (its worker stopping): its tokens are billed
            self._bill(u)
            return
        if self.choices is None:
            super().finish(reason, u)
        else:  # the answer's choices, or (streamed) that they were sent as chunks
            ev: dict[str, Any] = {"t": StreamEvent.DONE, "finish_reason": reason,
                                  "prompt_tokens": u.prompt_tokens,
                                  "completion_tokens": u.completion_tokens,
                                  "batch_rows": u.batch_rows}
            if self.streamed:
                ev["chunked"] = True
            else:
                ev["choices"] = generation_choices(self.kind, self.choices, self.top)
            self._send(ev)
        metrics.observe_request(lanes.REALTIME, self.model, str(self.msg["kind"]), "ok",
                                u.accelerator_s)
        self._bill(u)

    def error(self, status: int, err: dict[str, Any]) -> None:
        if self.ended:
            return
        metrics.observe_request(lanes.REALTIME, self.model, str(self.msg["kind"]), "error",
                                None)
        super().error(status, err)

    def abandoned(self, u: Usage) -> None:
        """Called by the engine when it drops the sequence because its client left (or
        the stream was ended here)."""
        self._bill(u)
        self.end()

    def _bill(self, u: Usage) -> None:
        if self.meter is not None:
            self.meter.put(self.msg, usage.COMPLETIONS, u.prompt_tokens, u.completion_tokens,
                           u.accelerator_s)


class ServicedSink(MeteredSink):
    """A token stream that also reports its service to the admission model: how long
    it held a row of the decode batch (start to finish, steps shared with other work
    included) and its first step (start to first text)."""

    def __init__(self, publisher: Publisher, msg: dict[str, Any], cancels: CancelListener,
                 meter: UsageWriter | None, service: service_rates.ServiceMeter,
                 on_end: Callable[[], None] | None = None) -> None:
        super().__init__(publisher, msg, cancels, meter, on_end)
        self.service, self.servers = service, 1
        self.t_start: float | None = None
        self.t_first: float | None = None

    def start(self) -> None:
        self.t_start = time.perf_counter()
        super().start()

    def delta(self, text: str) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        super().delta(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        super().piece(index, text, tokens)

    def finish(self, reason: FinishReason, u: Usage) -> None:
        super().finish(reason, u)
        self._served()

    def abandoned(self, u: Usage) -> None:
        super().abandoned(u)
        self._served()

    def _served(self) -> None:
        if self.t_start is None:
            return
        end = time.perf_counter()
        first = (self.t_first or end) - self.t_start
        self.service.record(self.model, end - self.t_start, first, self.servers)


class TracedSink:
    """A realtime stream's sink (any of the above) with the request's trace, used only
    when tracing is on: events on the request's span when the engine admits the
    sequence and at its first token, a child span for the engine step that prefilled it
    (admission to first token) and one for the decode steps that followed (first token
    to the end). Nothing per token beyond a bool check; the span ends with the stream."""

    def __init__(self, inner: MeteredSink, span: Span) -> None:
        self.inner, self.span = inner, span
        self.step: Span | None = None
        self.first, self.ended = True, False

    def start(self) -> None:
        self.inner.start()
        self.span.add_event("engine.admitted")
        self.step = tracing.child(self.span, "engine prefill")

    def delta(self, text: str) -> None:
        self._first()
        self.inner.delta(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        self._first()
        self.inner.piece(index, text, tokens)

    def choice_end(self, index: int, reason: str) -> None:
        self.inner.choice_end(index, reason)

    def _first(self) -> None:
        if self.first:
            self.first = False
            self.span.add_event("first_token")
            tracing.end(self.step)
            self.step = tracing.child(self.span, "engine decode")

    def finish(self, reason: FinishReason, u: Usage) -> None:
        self.inner.finish(reason, u)
        self._end(None, u, {"inferq.finish_reason": str(reason)})

    def fail(self, error: Exception) -> None:
        self.inner.fail(error)
        self._end(error, None)

    def error(self, status: int, err: dict[str, Any]) -> None:
        self.inner.error(status, err)
        self._end(str(err.get("message", "error")), None,
                  {"http.response.status_code": status})

    def abandoned(self, u: Usage) -> None:
        self.inner.abandoned(u)
        self.span.add_event("cancelled")
        self._end(None, u)

    def cancelled(self) -> bool:
        return self.inner.cancelled()

    def _end(self, error: BaseException | str | None, u: Usage | None,
             attributes: dict[str, Any] | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        attrs = dict(attributes or {})
        if u is not None:
            attrs.update({"gen_ai.usage.input_tokens": u.prompt_tokens,
                          "gen_ai.usage.output_tokens": u.completion_tokens,
                          "inferq.accelerator_s": u.accelerator_s})
            if self.step is not None and not self.first:
                self.step.set_attribute("inferq.decode_steps", max(0, u.completion_tokens - 1))
        tracing.end(self.step, error)
        tracing.end(self.span, error, attrs)
