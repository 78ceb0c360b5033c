"""Serving one realtime request, below the views: admitted by the lane (after the
project's limits granted it), routed to a version (a canary takes its share), sent to
the workers, its tokens settled against the grant once known, and mirrored to the
shadow versions after the client's answer. Embeddings get a whole answer; generation a
token stream, read whole or passed on as it comes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from jobs.core.context import Context
from jobs.core.lanes import REALTIME
from jobs.core.status import StreamEvent
from jobs.fleet import placement, rollout, shadow
from jobs.realtime import shadow as mirror
from jobs.realtime.client import (
    ON_DEMAND,
    Answer,
    Placer,
    RealtimeClient,
    TokenStream,
    error_from_event,
)
from jobs.slo import admission
from jobs.tenants import limits, token_counts


@dataclass(frozen=True)
class Caller:
    """Who a request is billed to: its project and key."""

    tenant_id: str
    api_key_id: str | None


def placer(ctx: Context) -> Placer:
    """How the lane places a version no live worker holds (``jobs.fleet.placement``), or
    the on-demand marker (INFERQ_PLACEMENT=on_demand)."""
    if ctx.settings.placement == "on_demand":
        return ON_DEMAND
    return lambda ref: placement.ensure(ctx, ref, REALTIME)


def _admitted(ctx: Context, model: str, grant: limits.Grant) -> admission.Ticket:
    """The lane's admission, after the project's limits: refused, the grant goes back."""
    try:
        return admission.admit(ctx, model)
    except Exception:
        limits.settle(ctx, grant, 0)
        limits.release_stream(ctx, grant)
        raise


def embed(ctx: Context, model: str, body: dict[str, Any], grant: limits.Grant,
          caller: Caller, version: str | None = None) -> tuple[Answer, str | None]:
    """A worker's answer to an embeddings request, and the version that gave it
    (``version``: the one the request named)."""
    ticket = _admitted(ctx, model, grant)
    t0 = time.perf_counter()
    try:
        route = rollout.route(ctx, model, version)
        client = RealtimeClient(ctx.redis, tenant_id=caller.tenant_id,
                                api_key_id=caller.api_key_id, version=route.version,
                                place=placer(ctx))
        answer = client.answer("embeddings", body, ctx.settings.realtime_timeout_s)
    except Exception:
        limits.settle(ctx, grant, 0)  # not answered: its tokens are given back
        raise
    finally:
        ticket.release()
    if (real := token_counts.body_usage_tokens(answer.body)) is not None:
        limits.settle(ctx, grant, real)
    if route.shadows and route.version:
        shadow.record(ctx.redis, model, route.version, "primary", time.perf_counter() - t0)
        mirror.mirror_embeddings(ctx, body, answer.body, route.shadows)
    return answer, route.version


@dataclass
class Generation:
    """An open token stream of one generation request, with what it holds: the grant
    of its project's limits, its admission ticket and the route that chose its version.
    Read it whole (``collect``) or as it comes (``events``); ``close`` in any case."""

    ctx: Context
    kind: str
    model: str
    body: dict[str, Any]
    grant: limits.Grant
    ticket: admission.Ticket
    route: rollout.Route
    stream: TokenStream
    started: float = field(default_factory=time.perf_counter)
    parts: list[str] = field(default_factory=list)
    closed: bool = False

    @property
    def version(self) -> str | None:
        return self.route.version

    def events(self) -> Iterator[dict[str, Any] | None]:
        """The stream's events (None: a keep-alive), its slot renewed as they come; at
        its end the tokens are settled and the answer mirrored to the shadows."""
        for ev in self.stream.events():
            limits.renew_stream(self.ctx, self.grant)
            if ev is not None and ev["t"] == StreamEvent.DELTA:
                self.parts.append(ev["text"])
            elif ev is not None and ev["t"] == StreamEvent.DONE:
                self._done(ev)
            yield ev

    def collect(self) -> dict[str, Any]:
        """The whole answer: the stream's end event (its text in ``text``); an error
        event raises its error."""
        done = None
        try:
            for ev in self.stream.events():
                if ev is None:
                    continue
                if ev["t"] == StreamEvent.DELTA:
                    self.parts.append(ev["text"])
                elif ev["t"] == StreamEvent.DONE:
                    done = ev
                elif ev["t"] == StreamEvent.ERROR:
                    raise error_from_event(ev)
        finally:
            self.stream.close()
            self.ticket.release()
        assert done is not None
        self._done(done)
        return {**done, "text": "".join(self.parts)}

    def _done(self, ev: dict[str, Any]) -> None:
        limits.settle(self.ctx, self.grant, ev["prompt_tokens"] + ev["completion_tokens"])
        if self.route.shadows and self.route.version:
            shadow.record(self.ctx.redis, self.model, self.route.version, "primary",
                          time.perf_counter() - self.started)
            mirror.mirror_generation(self.ctx, self.kind, self.body, "".join(self.parts),
                                     self.route.shadows)

    def close(self) -> None:
        """The stream closed (a client gone cancels its sequence at the next step) and
        its slot given back; safe to call more than once."""
        if not self.closed:
            self.closed = True
            self.stream.close()
        limits.release_stream(self.ctx, self.grant)

    def release(self) -> None:
        """Out of the lane's admission count (once the answer ended)."""
        self.ticket.release()


def reservation_cap(ctx: Context, model: str, body: dict[str, Any], caller: Caller) -> int:
    """The tokens this generation may reserve (its project's cap for ``model``; 0: none),
    for the worker to check once the prompt's length is known. A body that names its
    max_tokens and reserves more already is refused here (400)."""
    cap = limits.limits_for(ctx, caller.tenant_id, model).realtime_request_tokens
    n, best_of = body.get("n") or 1, body.get("best_of") or 0
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(max_tokens, int) and isinstance(n, int) and isinstance(best_of, int):
        refused = limits.reservation_refused(cap, max(n, best_of), max_tokens,
                                             "best_of" if best_of > n else "n")
        if refused is not None:
            raise refused
    return cap


def generate(ctx: Context, kind: str, model: str, body: dict[str, Any],
             grant: limits.Grant, caller: Caller, version: str | None = None) -> Generation:
    """A generation request admitted, routed (to ``version``, where the request named
    one) and its stream opened: errors before any token (a bad prompt, no worker) raise
    here, with everything given back."""
    st = ctx.settings
    try:
        cap = reservation_cap(ctx, model, body, caller)
    except Exception:
        limits.settle(ctx, grant, 0)
        limits.release_stream(ctx, grant)
        raise
    ticket = _admitted(ctx, model, grant)
    try:
        route = rollout.route(ctx, model, version)
        stream = TokenStream(ctx.redis, kind, body, first_event_s=st.first_token_timeout_s,
                             idle_s=st.no_progress_timeout_s, tenant_id=caller.tenant_id,
                             api_key_id=caller.api_key_id, version=route.version,
                             place=placer(ctx), max_reserved_tokens=cap)
        stream.open()
    except Exception:
        limits.settle(ctx, grant, 0)  # nothing ran: its tokens and its stream slot go back
        limits.release_stream(ctx, grant)
        ticket.release()
        raise
    return Generation(ctx, kind, model, body, grant, ticket, route, stream)
