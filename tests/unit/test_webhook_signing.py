"""Webhook signing and retry delays, checked against the ``openai`` SDK's own verifier
(``client.webhooks.verify_signature`` / ``unwrap``): pure, no services."""

from __future__ import annotations

import time

import openai
import pytest
from openai import OpenAI

from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.webhooks import events as webhooks
from jobs.webhooks import signing
from jobs.webhooks.deliveries import backoff

SDK = OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")


def test_a_delivery_verifies_with_the_sdk_and_only_with_its_secret() -> None:
    secret, other = signing.new_secret(), signing.new_secret()
    body = webhooks.event_body("evt_1", "job.completed", "job_1", int(time.time())).encode()
    headers = signing.signed_headers("wh_1", body, [secret])
    SDK.webhooks.verify_signature(body, headers, secret=secret)
    event = SDK.webhooks.unwrap(body, headers, secret=secret)
    assert (event.id, event.type) == ("evt_1", "job.completed")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.verify_signature(body, headers, secret=other)
    with pytest.raises(openai.InvalidWebhookSignatureError):  # the body is what is signed
        SDK.webhooks.verify_signature(body.replace(b"job_1", b"job_2"), headers, secret=secret)
    both = signing.signed_headers("wh_1", body, [secret, other])  # during a rotation
    for key in (secret, other):
        SDK.webhooks.verify_signature(body, both, secret=key)


def test_an_old_timestamp_is_refused_so_every_attempt_is_signed_anew() -> None:
    secret = signing.new_secret()
    body = b'{"id": "evt_1"}'
    stale = signing.signed_headers("wh_1", body, [secret], timestamp=int(time.time()) - 600)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.verify_signature(body, stale, secret=secret)


def test_retry_delays_grow_exponentially_with_jitter_and_a_cap() -> None:
    ctx = Context(Settings(webhook_retry_base_s=2.0, webhook_retry_max_s=60.0))
    for attempt, full in ((1, 2.0), (2, 4.0), (3, 8.0), (6, 60.0), (30, 60.0)):
        delays = [backoff(ctx, attempt) for _ in range(200)]
        assert all(full * 0.5 <= d <= full for d in delays), (attempt, min(delays))
        assert max(delays) - min(delays) > full * 0.2  # jittered, not one value
