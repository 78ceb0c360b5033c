"""Retiring a model version nothing is pinned to (``inferq models remove``, ``DELETE
/v1/organization/models/{name}/versions/{version}``).

Refused (409 ``model_version_in_use``, one line) while something still names the
version:

- it is the name's default and the name has other versions (make another the default
  first; the last version of a name can go, and the name with it);
- it has a canary weight or a shadow share (roll it back first), or a warm pool
  (``min_resident`` above 0);
- a derived version (``registry.derive``) serves its files;
- a batch pinned to it has not ended (``batches.model_version``), or a job routed to it
  is queued or running (``jobs.model_version``).

The checks and the row's deletion are one transaction under the name's registry lock,
so no registration, rollout step or derivation of the name runs between them. New work
cannot be routed to a version that is neither the default nor a canary (batches pin the
default, requests and jobs go to the default or a canary), except by an API process
whose routing snapshot is older than ``jobs.fleet.rollout.TTL_S``; such work fails with
``model_not_found``/``model_not_loaded`` rather than being answered by another version.

Then its objects go: the manifest first (the store no longer claims the version is
complete), then its files, unless the version was itself derived (the files are its
base's). Live workers holding it are told to unload it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, or_, select

from jobs.core import refs
from jobs.core.context import Context
from jobs.core.errors import Conflict, ModelNotFound, shown
from jobs.core.schema import Batch, Job, Model
from jobs.core.status import TERMINAL, JobStatus
from jobs.fleet import placement, registry
from storage import keys

IN_USE = "model_version_in_use"


@dataclass(frozen=True)
class Removed:
    name: str
    version: str
    files_deleted: int  # objects deleted from the store (0: the files were another's)
    unloaded_on: tuple[str, ...]  # live workers told to unload it


def remove(ctx: Context, name: str, version: str, unload: bool = True) -> Removed:
    """Retire ``name``'s ``version`` (see the module docstring); NotFound when it is not
    registered, Conflict when something still names it. ``unload``: tell the live
    workers holding it (Redis known)."""
    if registry.get(ctx, name, version) is None:
        raise _no_version(name, version)
    try:
        m = registry.unregister(ctx, name, version, _refuse_if_in_use)
    except ValueError:  # removed by another process meanwhile
        raise _no_version(name, version) from None
    deleted = 0
    if m.object_prefix == keys.model_prefix(name, version):
        ctx.store.delete(keys.model_manifest(name, version))
        for key in ctx.store.list(m.object_prefix):
            ctx.store.delete(key)
            deleted += 1
        deleted += 1
    told = _unload(ctx, refs.model_ref(name, version)) if unload else ()
    return Removed(name, version, deleted, told)


def _refuse_if_in_use(s: Any, m: Model) -> None:
    ref = refs.model_ref(m.name, m.version)
    others = list(s.scalars(select(Model.version).where(Model.name == m.name,
                                                        Model.version != m.version)))
    if m.is_default and others:
        raise Conflict(f"{ref} is the default of {m.name}: make another version the default "
                       "first (inferq models default, or promote a canary)", param="version",
                       code=IN_USE)
    if m.traffic_weight > 0 or m.shadow_share > 0:
        raise Conflict(f"{ref} takes a share of {m.name}'s traffic (canary "
                       f"{m.traffic_weight:g}, shadow {m.shadow_share:g}): roll it back first",
                       param="version", code=IN_USE)
    if m.min_resident > 0:
        raise Conflict(f"{ref} has a warm pool of {m.min_resident}: set its pool to 0 first",
                       param="version", code=IN_USE)
    sharing = sorted(s.scalars(select(Model.version).where(
        Model.name == m.name, Model.version != m.version,
        Model.object_prefix == m.object_prefix)), key=registry.version_key)
    if sharing and m.object_prefix == keys.model_prefix(m.name, m.version):
        raise Conflict(f"{ref}'s files are served by {m.name}@{sharing[0]} (derived from it): "
                       "remove that first", param="version", code=IN_USE)
    batches = s.scalar(select(func.count()).select_from(Batch).where(
        Batch.model == m.name, _taking(Batch.model_version, m),
        Batch.status.not_in([str(t) for t in TERMINAL])))
    if batches:
        raise Conflict(f"{ref}: {batches} batch(es) pinned to it have not ended: wait for them, "
                       "or cancel them", param="version", code=IN_USE)
    jobs = s.scalar(select(func.count()).select_from(Job).where(
        Job.body["model"].astext == m.name, _taking(Job.model_version, m),
        Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])))
    if jobs:
        raise Conflict(f"{ref}: {jobs} job(s) routed to it are queued or running: wait for "
                       "them", param="version", code=IN_USE)


def _taking(version: Any, m: Model) -> Any:
    """Rows (batches, jobs) that run on the version ``m``: pinned to it, or, for the
    default, pinned to none yet (a batch takes its version when validated, and one
    validating takes the default then, which the checks above keep unless it is the
    name's last)."""
    pinned = version == m.version
    return or_(pinned, version.is_(None)) if m.is_default else pinned


def _unload(ctx: Context, ref: str) -> tuple[str, ...]:
    """Tell the live workers holding ``ref`` to unload it; the ones told (none when Redis
    cannot be asked: they keep a copy nothing routes to until they restart)."""
    import redis

    try:
        holders = placement.holders(placement.model_workers(ctx.redis), ref)
        for b in holders:
            placement.command(ctx.redis, str(b["name"]), "unload", ref, "command")
    except redis.RedisError:
        return ()
    return tuple(sorted(str(b["name"]) for b in holders))


def _no_version(name: str, version: str) -> ModelNotFound:
    return ModelNotFound(f"{shown(name)} has no version {shown(version)}", param="version")
