"""Which version of a model serves a request: the default, a canary, or the one it names.

A name's realtime requests and jobs are split between its versions by their
``traffic_weight`` (a canary; the default version takes what the canaries leave);
a batch is pinned to the default version when it is validated and keeps it to the
end. A version with a ``shadow_share`` gets that share of the default version's
realtime requests mirrored to it: answered, compared with the default's answer
(jobs.fleet.shadow), never returned.

A realtime request or job that names one version (``name@version``: the model field
split by jobs.core.refs before it gets here) is served by that version whatever the
weights say, is not counted in the split and is never mirrored: the way to compare two
versions on the same inputs.

The split is a smooth weighted round robin per process (as nginx's upstream
balancing): each pick adds every version's weight to its credit, takes the version
with the most credit and takes 1 from that. Over any run of n picks a version of
weight w is chosen within one of n x w times, so the split holds exactly for small
samples too, with no random number. Shadows use the same credit scheme per version.

The routing table is read from the registry at most every ``TTL_S`` (one query over
the ``models`` rows): a rollback made through any process stops new traffic to the
version within that time; one made by this process, at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.errors import MODEL_NOT_FOUND, InvalidRequest, ModelNotFound, shown
from jobs.core.schema import Model
from jobs.fleet import placement, registry, shadow
from jobs.protocol.objects.fleet import Rollout

TTL_S = 0.5


@dataclass(frozen=True)
class Plan:
    """A name's routing: its default version, its canaries and shadows (version, share),
    and every version it has."""

    name: str
    default: str | None
    canaries: tuple[tuple[str, float], ...] = ()
    shadows: tuple[tuple[str, float], ...] = ()
    versions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Route:
    """Where one request goes: the version that answers it (None for a name the
    registry does not hold) and the versions it is mirrored to."""

    version: str | None
    shadows: tuple[str, ...] = ()


def load(ctx: Context) -> dict[str, Plan]:
    """Every name's routing now (one query)."""
    rows: dict[str, list[Model]] = {}
    with ctx.db.session() as s:
        for m in s.scalars(select(Model)):
            rows.setdefault(m.name, []).append(m)
    out = {}
    for name, ms in rows.items():
        ms.sort(key=lambda m: registry.version_key(m.version))
        default = next((m.version for m in ms if m.is_default), None)
        out[name] = Plan(name, default,
                         tuple((m.version, m.traffic_weight) for m in ms
                               if not m.is_default and m.traffic_weight > 0),
                         tuple((m.version, m.shadow_share) for m in ms
                               if not m.is_default and m.shadow_share > 0),
                         tuple(m.version for m in ms))
    return out


_snapshots = registry.Snapshots(load, TTL_S)


def plans(ctx: Context, ttl_s: float = TTL_S) -> dict[str, Plan]:
    """``load`` at most once per ``ttl_s`` per database, at once after this process
    changed the registry."""
    return _snapshots.get(ctx, ttl_s)


@dataclass
class Router:
    """The split of one process: credits per name (canaries) and per version (shadows)."""

    credit: dict[str, dict[str, float]] = field(default_factory=dict)
    shadow_credit: dict[tuple[str, str], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def route(self, plan: Plan | None) -> Route:
        if plan is None or plan.default is None:
            return Route(None)
        with self.lock:
            version = self._pick(plan)
            shadows = self._mirror(plan) if version == plan.default else ()
        return Route(version, shadows)

    def _pick(self, plan: Plan) -> str:
        assert plan.default is not None
        if not plan.canaries:
            return plan.default
        weights = dict(plan.canaries)
        weights[plan.default] = max(0.0, 1.0 - sum(weights.values()))
        credit = self.credit.setdefault(plan.name, {})
        for v in list(credit):
            if v not in weights:
                del credit[v]
        for v, w in weights.items():
            credit[v] = credit.get(v, 0.0) + w
        best = max(weights, key=lambda v: (credit[v], weights[v]))
        credit[best] -= 1.0
        return best

    def _mirror(self, plan: Plan) -> tuple[str, ...]:
        out = []
        for v, share in plan.shadows:
            c = self.shadow_credit.get((plan.name, v), 0.0) + share
            if c >= 1.0 - 1e-9:
                c -= 1.0
                out.append(v)
            self.shadow_credit[(plan.name, v)] = c
        return tuple(out)


_router = Router()


def route(ctx: Context, name: str, version: str | None = None) -> Route:
    """The version that serves one realtime request or job for ``name`` now, and the
    versions it is mirrored to (realtime only); ``version``: the one the request named,
    which serves it (400 ``model_not_found`` when the name has no such version: it
    was retired after the request was validated)."""
    plan = plans(ctx).get(name)
    if version is None:
        return _router.route(plan)
    if plan is None or version not in plan.versions:
        raise InvalidRequest(f"The model {shown(name)} has no version {shown(version)}",
                             param="model", code=MODEL_NOT_FOUND)
    return Route(version)


# What an operator sees and changes ----------------------------------------------------------


def status(ctx: Context, name: str) -> Rollout:
    """A name's versions with their traffic, shadow share, warm pool and residency (the
    live workers holding each, the loads so far), and the shadow report.
    NotFound for a name the registry does not hold."""
    versions = registry.versions(ctx, name)
    if not versions:
        raise ModelNotFound(f"The model {shown(name)} does not exist", param="model")
    return Rollout.of(name, versions, placement.where(ctx.redis),
                      placement.load_counts(ctx.redis),
                      shadow.report(ctx.redis, name))


def change(ctx: Context, name: str, version: str | None, weight: float | None = None,
           shadow_share: float | None = None, promote: bool = False,
           rollback: bool = False) -> Rollout:
    """One rollout step: a canary ``weight`` and/or ``shadow_share`` for ``version``,
    its promotion, or a rollback (of ``version``, or of every canary and shadow of the
    name). InvalidRequest for a step that does not hold together."""
    steps = sum((weight is not None or shadow_share is not None, promote, rollback))
    if steps != 1:
        raise InvalidRequest("give one step: a weight and/or a shadow share, promote, "
                             "or rollback")
    if version is None and not rollback:
        raise InvalidRequest("a version is required", param="version")
    try:
        if promote:
            assert version is not None
            registry.promote(ctx, name, version)
        elif rollback:
            registry.rollback(ctx, name, version)
        else:
            assert version is not None
            registry.set_rollout(ctx, name, version, weight, shadow_share)
    except ValueError as e:
        raise InvalidRequest(str(e), param="version") from None
    return status(ctx, name)


def set_pool(ctx: Context, name: str, version: str, min_resident: int | None,
             idle_unload_s: int | None, keep_forever: bool = False) -> Rollout:
    try:
        registry.set_pool(ctx, name, version, min_resident, idle_unload_s, keep_forever)
    except ValueError as e:
        raise InvalidRequest(str(e), param="version") from None
    return status(ctx, name)
