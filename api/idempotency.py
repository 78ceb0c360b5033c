"""The ``Idempotency-Key`` header on creating POSTs (files, batches, jobs)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, g, request

from api.current import context
from jobs.core import idempotency
from storage.objects import CHUNK


def request_hash() -> str:
    """Of the method, path and body; an upload's file is hashed from its spooled copy."""
    h = hashlib.sha256(f"{request.method} {request.path}\n".encode())
    if request.files:
        for name, f in sorted(request.form.items(multi=True)):
            h.update(f"{name}={f}\n".encode())
        for name, up in sorted(request.files.items(multi=True), key=lambda x: x[0]):
            h.update(f"{name}:{up.filename}\n".encode())
            while block := up.stream.read(CHUNK):
                h.update(block)
            up.stream.seek(0)
    else:
        h.update(request.get_data(cache=True))
    return h.hexdigest()


def idempotent(view: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return view(*args, **kwargs)
        ctx, tenant = context(), g.tenant_id
        replay = idempotency.begin(ctx, tenant, key, request_hash())
        if replay is not None:
            return Response(replay.body, status=replay.status, mimetype="application/json",
                            headers={"Idempotent-Replayed": "true"})
        # A refused request created nothing, and what refused it may change (a model
        # registered, a file uploaded, a data location granted, a limit raised): its key
        # stays unused, so the same request sent again is run again, not answered with
        # the refusal (a notebook cell run again after the fix sends the same key).
        try:
            resp = current_app.make_response(view(*args, **kwargs))
        except BaseException:
            idempotency.abandon(ctx, tenant, key)
            raise
        if resp.status_code >= 400:
            idempotency.abandon(ctx, tenant, key)
            return resp
        idempotency.finish(ctx, tenant, key, resp.status_code, resp.get_data())
        return resp

    wrapper.idempotent = True  # type: ignore[attr-defined]  # /openapi.json says so
    return wrapper
