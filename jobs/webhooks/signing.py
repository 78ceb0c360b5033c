"""How every webhook delivery is signed, and its secrets made.

Signing is Standard Webhooks', as OpenAI's: ``webhook-id`` (the delivery's id, the
same on every attempt), ``webhook-timestamp`` (the attempt's time) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` keyed by
the base64-decoded part of the ``whsec_`` secret; during a rotation that keeps the
old secret, one signature per secret, space-separated.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time

from jobs.core.schema import now
from jobs.core.webhook_tables import WebhookCallbackSecret, WebhookEndpoint


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def secret_hint(secret: str) -> str:
    return f"whsec_...{secret[-4:]}"


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = (base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_")
           else secret.encode())
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signed_headers(msg_id: str, body: bytes, keys: list[str],
                   timestamp: int | None = None) -> dict[str, str]:
    """The headers of one attempt: signed now, with every secret in ``keys``."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {"content-type": "application/json", "user-agent": "inferq-webhooks",
            "webhook-id": msg_id, "webhook-timestamp": str(ts),
            "webhook-signature": " ".join(signature(k, msg_id, ts, body) for k in keys)}


def active_secrets(row: WebhookEndpoint | WebhookCallbackSecret, t: int | None = None
                   ) -> list[str]:
    """The secrets a delivery is signed with: the current one, and the previous one
    while a rotation keeps it valid."""
    t = now() if t is None else t
    keys = [row.secret]
    if row.old_secret and (row.old_secret_expires_at or 0) > t:
        keys.append(row.old_secret)
    return keys
