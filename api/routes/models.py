"""/v1/models: the default version of each registered model, and where each of its
versions is resident."""

from __future__ import annotations

from api.current import context
from api.routes.contract import Blueprint
from jobs.core.errors import ModelNotFound
from jobs.core.schema import Model
from jobs.fleet import placement, registry
from jobs.protocol.objects.fleet import ModelList, ModelObject

bp = Blueprint("models", __name__, access="project")


@bp.get("/models")
def list_() -> ModelList:
    ctx = context()
    where, engines = placement.where(ctx.redis), placement.engines(ctx.redis)
    by_name: dict[str, list[Model]] = {}
    for v in registry.all_versions(ctx):
        by_name.setdefault(v.name, []).append(v)
    return ModelList(data=[ModelObject.of(m, by_name.get(m.name, [m]), where, engines)
                           for m in registry.list_models(ctx)])


@bp.get("/models/<path:model_id>")
def retrieve(model_id: str) -> ModelObject:
    ctx = context()
    m = registry.get_default(ctx, model_id)
    if m is None:
        raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
    return ModelObject.of(m, registry.versions(ctx, model_id), placement.where(ctx.redis),
                          placement.engines(ctx.redis))
