"""Interactive endpoints, answered by workers over the realtime lane."""

from __future__ import annotations

from flask import Blueprint, Response

from api import context
from api.schemas import json_body
from jobs.realtime import RealtimeClient
from jobs.requests import parse_embeddings

bp = Blueprint("inference", __name__)


@bp.post("/embeddings")
def embeddings() -> Response:
    ctx = context()
    req = parse_embeddings(json_body(), ctx.settings.max_embedding_inputs)
    body = RealtimeClient(ctx.redis).call("embeddings", req.model_dump(exclude_none=True),
                                          ctx.settings.realtime_timeout_s)
    return Response(body, mimetype="application/json")
