"""/v1/organization/models: a data team's own model versions added and retired, rollouts
and warm pools of model versions, and where each is resident (inferq extensions of the
Admin API; admin keys only)."""

from __future__ import annotations

from typing import Annotated, Literal

from flask import request
from pydantic import BaseModel, ConfigDict, Field

from api.current import context
from api.request_parsing import json_body
from api.routes.contract import Blueprint
from jobs.core import refs
from jobs.core.errors import ModelNotFound, shown
from jobs.fleet import own_models, registry, retire, rollout
from jobs.protocol.objects.common import Deleted
from jobs.protocol.objects.fleet import Rollout, RolloutList
from jobs.protocol.validation import parse_model

bp = Blueprint("fleet", __name__, access="admin")


@bp.before_request
def _check_path_ids() -> None:
    """A name or version no model can have is a 404 before any lookup."""
    for arg in ("name", "version"):
        value = (request.view_args or {}).get(arg)
        if value is not None and not registry.valid_segment(value):
            raise ModelNotFound(f"The model {shown(value)} does not exist", param="model")

Share = Annotated[float, Field(ge=0.0, le=1.0)]


class RolloutStep(BaseModel):
    """One step: a canary ``weight`` and/or ``shadow`` share for ``version``, or an
    ``action``: ``promote`` (the version becomes the default, every canary and shadow
    of the name cleared) or ``rollback`` (of ``version``; of every canary and shadow
    when no version is given)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    version: str | None = Field(default=None, max_length=64)
    weight: Share | None = None
    shadow: Share | None = None
    action: Literal["promote", "rollback"] | None = None


class PoolBody(BaseModel):
    """A version's warm pool: copies kept resident, and the idle time after which an
    extra copy is unloaded (null: never)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    min_resident: Annotated[int, Field(strict=True, ge=0, le=10_000)] | None = None
    idle_unload_s: Annotated[int, Field(strict=True, ge=1, le=10**9)] | None = None


class ModelAdd(BaseModel):
    """A model version published from a folder the API's host can read: a local path or
    an object-store URI ``s3://bucket/prefix/`` (jobs.fleet.folder_checks checks it first)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    version: str | None = Field(default=None, min_length=1, max_length=64)
    kind: Literal["embeddings", "chat", "completions"]
    source: str = Field(min_length=1, max_length=512)
    precision: Literal["fp32", "bf16", "fp16", "int8"] = "fp32"
    engine: Literal["auto", "transformers", "vllm"] = "auto"
    default: bool = False
    allow_pickle: bool = False
    matryoshka: bool = False


@bp.post("/models", body=ModelAdd, errors={409})
def add() -> Rollout:
    """Publish a version; the name's rollout (its versions) as the routes below answer."""
    ctx = context()
    body = parse_model(ModelAdd, json_body())
    own_models.add(ctx, body.name, body.source, body.kind, body.version, body.precision,
                   body.default, body.allow_pickle, body.engine, body.matryoshka)
    return rollout.status(ctx, body.name)


@bp.delete("/models/<name>/versions/<version>", errors={409})
def remove(name: str, version: str) -> Deleted:
    """Retire a version nothing is pinned to (409 ``model_version_in_use`` otherwise)."""
    retire.remove(context(), name, version)
    return Deleted(id=refs.model_ref(name, version), object="model.version", deleted=True)


@bp.get("/models")
def list_() -> RolloutList:
    ctx = context()
    names = sorted({m.name for m in registry.all_versions(ctx)}, key=lambda n: (n.lower(), n))
    return RolloutList(data=[rollout.status(ctx, n) for n in names])


@bp.get("/models/<name>/rollout")
def get(name: str) -> Rollout:
    return rollout.status(context(), name)


@bp.post("/models/<name>/rollout", body=RolloutStep)
def step(name: str) -> Rollout:
    ctx = context()
    rollout.status(ctx, name)  # 404 first for a name that does not exist
    body = parse_model(RolloutStep, json_body())
    return rollout.change(ctx, name, body.version, body.weight, body.shadow,
                          promote=body.action == "promote",
                          rollback=body.action == "rollback")


@bp.post("/models/<name>/versions/<version>/pool", body=PoolBody)
def pool(name: str, version: str) -> Rollout:
    ctx = context()
    rollout.status(ctx, name)
    raw = json_body()
    body = parse_model(PoolBody, raw)
    keep = isinstance(raw, dict) and "idle_unload_s" in raw and raw["idle_unload_s"] is None
    return rollout.set_pool(ctx, name, version, body.min_resident, body.idle_unload_s,
                            keep_forever=keep)
