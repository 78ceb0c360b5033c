"""What the fleet serves and whether the service is up: the model objects and lists, a
model's rollout (its versions, their traffic and shadow comparisons), and health."""

from __future__ import annotations

from typing import Literal, Self

from jobs.core import refs
from jobs.core.schema import Model
from jobs.protocol.objects.common import Out


def _traffic(m: Model, versions: list[Model]) -> float:
    """A version's share of its name's traffic: a canary's weight; the default version
    takes what the canaries leave."""
    if not m.is_default:
        return m.traffic_weight
    canary = sum(v.traffic_weight for v in versions if not v.is_default)
    return round(max(0.0, 1.0 - canary), 6)


class VersionResidency(Out):
    id: str  # name@version: what a request's model names to be answered by this version
    version: str
    precision: str
    engine: str
    traffic_weight: float
    resident_on: list[str]
    engines_in_use: list[str]

    @classmethod
    def of(cls, v: Model, versions: list[Model], where: dict[str, list[str]],
           engines: dict[str, list[str]]) -> Self:
        """``v`` one of its name's ``versions``; ``where`` and ``engines``: ref -> the live
        workers holding it, the engines they run it on."""
        ref = refs.model_ref(v.name, v.version)
        return cls(id=ref, version=v.version, precision=v.precision, engine=v.engine,
                   traffic_weight=_traffic(v, versions), resident_on=where.get(ref, []),
                   engines_in_use=engines.get(ref, []))


class ModelObject(Out):
    """The OpenAI model object; version, kind, precision, engine, context_length, tools
    (its chat template renders tools; null: not known), matryoshka (an embeddings model
    that serves ``dimensions``), resident_on (the live workers holding the default
    version), engines_in_use (the engines those workers run it on) and versions (each
    with its traffic share, where it is resident and on which engines) are extensions."""

    id: str
    object: Literal["model"] = "model"
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

    @classmethod
    def of(cls, m: Model, versions: list[Model], where: dict[str, list[str]],
           engines: dict[str, list[str]]) -> Self:
        """``m`` the default version of its name, ``versions`` all of them; ``where`` and
        ``engines`` as ``VersionResidency.of`` takes them."""
        ref = refs.model_ref(m.name, m.version)
        return cls(id=m.name, created=m.created_at, owned_by=m.owned_by, version=m.version,
                   kind=m.kind, precision=m.precision, engine=m.engine,
                   context_length=m.context_length, tools=m.tools, matryoshka=m.matryoshka,
                   resident_on=where.get(ref, []), engines_in_use=engines.get(ref, []),
                   versions=[VersionResidency.of(v, versions, where, engines)
                             for v in versions])


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

    @classmethod
    def of(cls, m: Model, versions: list[Model], where: dict[str, list[str]],
           loads: dict[str, dict[str, int]]) -> Self:
        """``m`` one of its name's ``versions``; ``where``: ref -> the live workers holding
        it; ``loads``: ref -> reason -> the loads so far."""
        ref = refs.model_ref(m.name, m.version)
        return cls(version=m.version, default=m.is_default, precision=m.precision,
                   engine=m.engine, traffic_weight=_traffic(m, versions),
                   shadow_share=m.shadow_share, min_resident=m.min_resident,
                   idle_unload_s=m.idle_unload_s, resident_on=where.get(ref, []),
                   loads=loads.get(ref, {}))


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
    object: Literal["model.rollout"] = "model.rollout"
    name: str
    versions: list[RolloutVersion]
    shadow: list[ShadowRow]

    @classmethod
    def of(cls, name: str, versions: list[Model], where: dict[str, list[str]],
           loads: dict[str, dict[str, int]], shadow: list[ShadowRow]) -> Self:
        """The rollout of ``name``: its ``versions`` (``where`` and ``loads`` as
        ``RolloutVersion.of`` takes them) and its shadow report."""
        return cls(name=name, versions=[RolloutVersion.of(m, versions, where, loads)
                                        for m in versions], shadow=shadow)


class RolloutList(Out):
    object: Literal["list"] = "list"
    data: list[Rollout]


class ModelList(Out):
    object: Literal["list"] = "list"
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
    status: Literal["ok"] = "ok"
