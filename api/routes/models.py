"""/v1/models: the default version of each registered model, and where each of its
versions is resident."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api.current import context
from jobs.core import refs
from jobs.core.errors import ModelNotFound
from jobs.core.schema import Model
from jobs.fleet import placement, registry

bp = Blueprint("models", __name__)


def model_object(m: Model, versions: list[Model], where: dict[str, list[str]],
                 engines: dict[str, list[str]]) -> dict[str, Any]:
    """The OpenAI model object; version, kind, precision, engine, context_length, tools
    (its chat template renders tools; null: not known), matryoshka (an embeddings model
    that serves ``dimensions``), resident_on (the live workers
    holding the default version), engines_in_use (the engines those workers run it on)
    and versions (each with its traffic share, where it is resident and on which
    engines) are extensions."""
    canary = sum(v.traffic_weight for v in versions if not v.is_default)
    ref = refs.model_ref(m.name, m.version)
    return {"id": m.name, "object": "model", "created": m.created_at, "owned_by": m.owned_by,
            "version": m.version, "kind": m.kind, "precision": m.precision,
            "engine": m.engine, "context_length": m.context_length, "tools": m.tools,
            "matryoshka": m.matryoshka,
            "resident_on": where.get(ref, []), "engines_in_use": engines.get(ref, []),
            "versions": [{"version": v.version, "precision": v.precision, "engine": v.engine,
                          "traffic_weight": round(max(0.0, 1.0 - canary), 6) if v.is_default
                          else v.traffic_weight,
                          "resident_on": where.get(refs.model_ref(v.name, v.version), []),
                          "engines_in_use": engines.get(refs.model_ref(v.name, v.version), [])}
                         for v in versions]}


@bp.get("/models")
def list_() -> Any:
    ctx = context()
    where, engines = placement.where(ctx.redis), placement.engines(ctx.redis)
    by_name: dict[str, list[Model]] = {}
    for v in registry.all_versions(ctx):
        by_name.setdefault(v.name, []).append(v)
    return {"object": "list", "data": [model_object(m, by_name.get(m.name, [m]), where, engines)
                                       for m in registry.list_models(ctx)]}


@bp.get("/models/<path:model_id>")
def retrieve(model_id: str) -> Any:
    ctx = context()
    m = registry.get_default(ctx, model_id)
    if m is None:
        raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
    return model_object(m, registry.versions(ctx, model_id), placement.where(ctx.redis),
                        placement.engines(ctx.redis))
