"""/v1/models: the default version of each registered model."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api import context
from jobs import registry, service
from jobs.errors import NotFound
from jobs.models import Model

bp = Blueprint("models", __name__)


def model_object(m: Model) -> dict[str, Any]:
    """The OpenAI model object; version, kind, precision and context_length are
    extensions."""
    return {"id": m.name, "object": "model", "created": m.created_at, "owned_by": m.owned_by,
            "version": m.version, "kind": m.kind, "precision": m.precision,
            "context_length": m.context_length}


@bp.get("/models")
def list_() -> Any:
    return {"object": "list", "data": [model_object(m) for m in service.list_models(context())]}


@bp.get("/models/<path:model_id>")
def retrieve(model_id: str) -> Any:
    m = registry.get_default(context(), model_id)
    if m is None:
        raise NotFound(f"The model '{model_id}' does not exist", param="model",
                       code="model_not_found")
    return model_object(m)
