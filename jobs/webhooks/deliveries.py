"""Sending the outbox: the webhook delivery loop the control worker runs.

Each step claims due deliveries (``FOR UPDATE SKIP LOCKED``, so several control
workers share the work and never take the same row), as many as there are free send
slots and at most ``webhook_concurrency_per_target`` in flight per target (an
endpoint, or a callback URL), oldest first, and hands them to a bounded pool of
sender threads. An idle loop waits for a NOTIFY that the commit writing new
deliveries sends (``webhooks.emit``), or for the poll interval, whichever is first.

A claim is a lease: it moves the row's ``next_attempt_at`` past the send's own
timeouts (connect + read) plus a margin, so a row whose sender died (a killed control
worker, a lost connection) is simply due again then; nothing about a delivery lives
outside PostgreSQL. Results are written back fenced by the claim's token (a resend in
the meantime wins), one attempt row each in the delivery log.

A 2xx answer delivers it (``Outcome.delivered``, the rule a test delivery,
``send_test``, is judged by too). Anything else (another status, a timeout, a refused
connection, a target that now resolves to a refused address) is tried again after
``webhook_retry_base_s * 2^(attempt-1)`` seconds (capped at ``webhook_retry_max_s``)
times a random factor in [0.5, 1], until ``webhook_retry_period_s`` after the event;
then the delivery is ``failed`` (it can still be resent through the API). Every
attempt carries the delivery's id as ``webhook-id`` and is signed anew at its own
``webhook-timestamp``. A slow receiver holds at most its share of the send slots,
each for at most the timeouts; the others keep going.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, bindparam, func, select, update

from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, shown
from jobs.core.schema import new_id, now
from jobs.core.status import DeliveryStatus
from jobs.core.webhook_tables import (
    WebhookAttempt,
    WebhookCallbackSecret,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from jobs.webhooks import events as webhooks
from jobs.webhooks import signing
from storage import outbound
from storage.db import Listener

log = logging.getLogger("inferq.webhooks")


@dataclass(frozen=True)
class Claimed:
    """A delivery claimed for one attempt: what to send, where, signed with what."""

    id: str
    token: str
    attempt: int
    url: str
    body: bytes
    keys: tuple[str, ...]
    give_up_at: float


@dataclass(frozen=True)
class Outcome:
    started_at: float
    duration_ms: int
    status: int | None
    error: str | None

    @property
    def delivered(self) -> bool:
        """The one rule of every delivery, a test's included: a 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def failure(self) -> str | None:
        """Why the attempt did not deliver, in words; None when it did."""
        if self.delivered:
            return None
        if self.status is None:
            return f"no answer ({self.error})"
        why = " (redirects are not followed)" if 300 <= self.status < 400 else ""
        return f"the endpoint answered {self.status}; a delivery needs a 2xx answer{why}"


def backoff(ctx: Context, attempt: int) -> float:
    """Seconds before the attempt after ``attempt`` (1-based): exponential, capped,
    with jitter."""
    st = ctx.settings
    return min(st.webhook_retry_max_s, st.webhook_retry_base_s * 2 ** (attempt - 1)) \
        * random.uniform(0.5, 1.0)


def lease_s(ctx: Context) -> float:
    st = ctx.settings
    return st.webhook_connect_timeout_s + st.webhook_read_timeout_s + st.webhook_lease_margin_s


def claim(ctx: Context, limit: int) -> list[Claimed]:
    """Take up to ``limit`` due deliveries for one attempt each."""
    if limit <= 0:
        return []
    t = time.time()
    token = secrets.token_hex(8)
    d = WebhookDelivery
    pending = d.status == DeliveryStatus.PENDING
    target_of = func.coalesce(d.endpoint_id, d.url)  # an endpoint, or a callback URL
    # In flight: claimed (a token), not recorded yet, lease not passed.
    busy = (select(target_of.label("target"), func.count().label("n"))
            .where(pending, d.lease_token.is_not(None), d.next_attempt_at > t)
            .group_by(target_of).subquery())
    # Each due row's place in its target's queue (oldest first): a target gets at most
    # webhook_concurrency_per_target sends at once, so a receiver with a backlog that
    # hangs cannot take every slot.
    due_rows = (select(d.id, d.next_attempt_at, target_of.label("target"),
                       func.row_number().over(partition_by=target_of,
                                              order_by=d.next_attempt_at).label("rn"))
                .where(pending, d.next_attempt_at <= t).subquery())
    pick = (select(due_rows.c.id)
            .select_from(due_rows.outerjoin(busy, busy.c.target == due_rows.c.target))
            .where(due_rows.c.rn + func.coalesce(busy.c.n, 0)
                   <= ctx.settings.webhook_concurrency_per_target)
            .order_by(due_rows.c.next_attempt_at).limit(limit))
    due = (select(d.id).where(d.id.in_(pick.scalar_subquery()), pending,
                              d.next_attempt_at <= t)
           .with_for_update(skip_locked=True))
    with ctx.db.session() as s:
        rows = s.execute(
            update(WebhookDelivery).where(WebhookDelivery.id.in_(due.scalar_subquery()))
            .values(attempts=WebhookDelivery.attempts + 1, lease_token=token,
                    next_attempt_at=t + lease_s(ctx))
            .returning(WebhookDelivery.id, WebhookDelivery.event_id,
                       WebhookDelivery.endpoint_id, WebhookDelivery.url,
                       WebhookDelivery.tenant_id, WebhookDelivery.attempts,
                       WebhookDelivery.give_up_at)).all()
        if not rows:
            return []
        bodies = dict(s.execute(select(WebhookEvent.id, WebhookEvent.body).where(
            WebhookEvent.id.in_({r.event_id for r in rows}))).all())
        endpoint_ids = {r.endpoint_id for r in rows if r.endpoint_id}
        endpoints = {e.id: e for e in s.scalars(select(WebhookEndpoint).where(
            WebhookEndpoint.id.in_(endpoint_ids)))} if endpoint_ids else {}
        tenants = {r.tenant_id for r in rows if r.endpoint_id is None}
        callback = {c.tenant_id: c for c in s.scalars(select(WebhookCallbackSecret).where(
            WebhookCallbackSecret.tenant_id.in_(tenants)))} if tenants else {}
    out = []
    for r in rows:
        target: WebhookEndpoint | WebhookCallbackSecret | None
        if r.endpoint_id is not None:
            target = endpoints.get(r.endpoint_id)
            url = target.url if target is not None else None
        else:
            target, url = callback.get(r.tenant_id), r.url
        if target is None or url is None:
            continue  # its endpoint went (the row with it) or no secret to sign with
        out.append(Claimed(r.id, token, r.attempts, url, bodies[r.event_id].encode(),
                           tuple(signing.active_secrets(target)), r.give_up_at))
    return out


def post(ctx: Context, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    """One POST with the delivery settings (timeouts, allowed hosts, response bytes
    kept); raises OutboundRefused for a target that may not be sent to."""
    st = ctx.settings
    started = time.time()
    t0 = time.monotonic()
    res = outbound.post(url, body, headers, allow_hosts=st.webhook_allow_host_set,
                        connect_timeout=st.webhook_connect_timeout_s,
                        read_timeout=st.webhook_read_timeout_s,
                        max_body=st.webhook_max_response_bytes)
    return Outcome(started, int((time.monotonic() - t0) * 1000), res.status, res.error)


def attempt(ctx: Context, c: Claimed) -> Outcome:
    """One attempt: signed now; never raises for what the receiver or network did."""
    started = time.time()
    t0 = time.monotonic()
    try:
        return post(ctx, c.url, c.body, signing.signed_headers(c.id, c.body, list(c.keys)))
    except outbound.OutboundRefused as e:
        status, error = None, f"refused: {e}"
    except Exception as e:  # noqa: BLE001 - an attempt that failed in a way we did not foresee
        status, error = None, f"{type(e).__name__}: {shown(e, 300)}"
    return Outcome(started, int((time.monotonic() - t0) * 1000), status, error)


def send_test(ctx: Context, e: WebhookEndpoint, event_type: str) -> Outcome:
    """Send a sample event of ``event_type`` to the endpoint now, signed as a delivery
    is, and judged by the same rule (``Outcome.delivered``); nothing is recorded. A URL
    that may not be sent to is a 400 ``invalid_url``."""
    if event_type not in webhooks.EVENT_TYPES:
        raise InvalidRequest(f"event_type: {shown(event_type)} is not an event this service "
                             f"sends; one of {', '.join(webhooks.EVENT_TYPES)}",
                             param="event_type", code="unsupported_event_type")
    event_id = new_id("evt_")
    subject = ("batch_" if event_type.startswith("batch.") else "job_") + "test"
    body = webhooks.event_body(event_id, event_type, subject, now()).encode()
    headers = signing.signed_headers(new_id("wh_"), body, signing.active_secrets(e))
    try:
        return post(ctx, e.url, body, headers)
    except outbound.OutboundRefused as err:
        raise InvalidRequest(f"the endpoint's URL is refused: {err}", param="url",
                             code="invalid_url") from None


def record(ctx: Context, done: list[tuple[Claimed, Outcome]]) -> None:
    """Log the attempts and move their deliveries on (one transaction for all), each
    unless a resend took it meanwhile; a delivery whose endpoint was deleted is gone."""
    if not done:
        return
    t = time.time()
    table = cast(Table, WebhookDelivery.__table__)
    moves: list[dict[str, object]] = []
    with ctx.db.session() as s:
        alive = set(s.scalars(select(WebhookDelivery.id).where(
            WebhookDelivery.id.in_([c.id for c, _ in done]))))
        for c, o in done:
            if c.id not in alive:
                continue
            s.add(WebhookAttempt(delivery_id=c.id, attempt=c.attempt, started_at=o.started_at,
                                 duration_ms=o.duration_ms, status_code=o.status,
                                 error=o.error))
            nxt = t if o.delivered else t + backoff(ctx, c.attempt)
            status = (DeliveryStatus.DELIVERED if o.delivered else DeliveryStatus.FAILED
                      if nxt > c.give_up_at else DeliveryStatus.PENDING)
            if status == DeliveryStatus.FAILED:
                log.warning("webhook delivery %s failed for good after %d attempts: %s",
                            c.id, c.attempt, o.failure)
            moves.append({"b_id": c.id, "b_token": c.token, "b_status": str(status),
                          "b_next": nxt, "b_delivered": t if o.delivered else None,
                          "b_code": o.status, "b_error": o.error})
        s.flush()
        if moves:
            s.execute(update(table).where(table.c.id == bindparam("b_id"),
                                          table.c.lease_token == bindparam("b_token"))
                      .values(status=bindparam("b_status"), next_attempt_at=bindparam("b_next"),
                              delivered_at=bindparam("b_delivered"),
                              last_status_code=bindparam("b_code"),
                              last_error=bindparam("b_error"), lease_token=None), moves)


class Deliverer:
    """The loop: keeps up to ``webhook_concurrency`` sends in flight."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.slots = ctx.settings.webhook_concurrency
        self.pool = ThreadPoolExecutor(self.slots, thread_name_prefix="inferq-webhook-send")
        self.inflight: dict[Future[Outcome], Claimed] = {}
        self.next_claim = 0.0  # monotonic time by which free slots are claimed for anyway
        self.listener = Listener(ctx.db.url, webhooks.NOTIFY_CHANNEL)

    def step(self, wait_s: float) -> int:
        """Claim for the free slots, then wait up to ``wait_s`` for a send to end and
        record the ended ones; how many were claimed. Under load, claims are made for a
        quarter of the slots at a time (or once per ``wait_s``), not one per send."""
        now = time.monotonic()
        free = self.slots - len(self.inflight)
        claimed: list[Claimed] = []
        if free >= max(1, self.slots // 4) or (free and now >= self.next_claim):
            claimed = claim(self.ctx, free)
            self.next_claim = now + wait_s
        for c in claimed:
            self.inflight[self.pool.submit(attempt, self.ctx, c)] = c
        if self.inflight and wait_s > 0:
            wait(list(self.inflight), timeout=max(0.0, min(wait_s, self.next_claim - now)),
                 return_when=FIRST_COMPLETED)
        elif not claimed and wait_s > 0:
            self.listener.wait(wait_s)  # a commit that wrote deliveries ends it early
        self.collect()
        return len(claimed)

    def collect(self) -> None:
        done = [(self.inflight.pop(f), f.result()) for f in list(self.inflight) if f.done()]
        try:
            record(self.ctx, done)
        except Exception as e:  # noqa: BLE001 - their leases lapse and they are sent again
            log.warning("webhook deliveries %s: could not record their attempts: %s",
                        [c.id for c, _ in done], e)

    def run(self, stopping: threading.Event) -> None:
        every = self.ctx.settings.webhook_poll_interval_s
        failures = 0
        while not stopping.is_set():
            try:
                self.step(every)
                failures = 0
            except Exception as e:  # noqa: BLE001 - PostgreSQL away: try again, backing off
                if failures % 20 == 0:
                    log.warning("webhook deliveries: %s", e)
                failures += 1
                stopping.wait(min(5.0, every * 2 ** min(failures, 10)))
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.listener.close()
