"""What the fleet serves and whether the service is up: the model objects and lists, a
model's rollout (its versions, their traffic and shadow comparisons), and health."""

from __future__ import annotations

from typing import Literal

from api.schemas.common import Out


class VersionResidency(Out):
    version: str
    precision: str
    engine: str
    traffic_weight: float
    resident_on: list[str]
    engines_in_use: list[str]


class ModelObject(Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    version: str
    kind: str
    precision: str
    engine: str
    context_length: int | None
    tools: bool | None
    matryoshka: bool
    resident_on: list[str]
    engines_in_use: list[str]
    versions: list[VersionResidency]


class RolloutVersion(Out):
    version: str
    default: bool
    precision: str
    engine: str
    traffic_weight: float
    shadow_share: float
    min_resident: int
    idle_unload_s: int | None
    resident_on: list[str]
    loads: dict[str, int]


class ShadowRow(Out):
    version: str
    primary: int
    shadow: int
    errors: int
    compared: int
    agreement: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None


class Rollout(Out):
    object: Literal["model.rollout"]
    name: str
    versions: list[RolloutVersion]
    shadow: list[ShadowRow]


class RolloutList(Out):
    object: Literal["list"]
    data: list[Rollout]


class ModelList(Out):
    object: Literal["list"]
    data: list[ModelObject]


class HealthChecks(Out):
    database: str
    redis: str
    workers: int
    lanes: dict[str, int]
    models: dict[str, list[str]]


class Health(Out):
    """``status`` "ok" with 200; "unavailable" with 503."""

    status: Literal["ok", "unavailable"]
    checks: HealthChecks


class Liveness(Out):
    status: Literal["ok"]
