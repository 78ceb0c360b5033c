"""/v1/models."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api import context
from jobs import service
from jobs.errors import NotFound
from jobs.models import Model

bp = Blueprint("models", __name__)


def model_object(m: Model) -> dict[str, Any]:
    return {"id": m.id, "object": "model", "created": m.created_at, "owned_by": m.owned_by}


@bp.get("/models")
def list_() -> Any:
    return {"object": "list", "data": [model_object(m) for m in service.list_models(context())]}


@bp.get("/models/<path:model_id>")
def retrieve(model_id: str) -> Any:
    for m in service.list_models(context()):
        if m.id == model_id:
            return model_object(m)
    raise NotFound(f"The model '{model_id}' does not exist", param="model")
