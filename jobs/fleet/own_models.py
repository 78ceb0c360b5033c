"""A data team's own model: a folder checked, then published into the model repository.

``inferq models add`` and ``POST /v1/organization/models`` take a folder (a local
directory, or an object-store prefix ``s3://bucket/prefix/`` read with the deployment's
object-store credentials and endpoint: jobs.fleet.folders) and a kind, check that the
kind's engine can serve what it holds (jobs.fleet.folder_checks), and only then publish
it (``publishing.publish_dir``: files, then their sha256 manifest, then the registry
row). Nothing is uploaded for a folder that is refused, and an object-store folder's
weights are downloaded only after the checks (which read its JSON files alone) passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jobs.core.context import Context
from jobs.core.errors import Conflict, InvalidRequest, shown
from jobs.core.schema import Model
from jobs.fleet import publishing, registry
from jobs.fleet.folder_checks import KINDS, check
from jobs.fleet.folders import local_copy, open_folder

# The registry kind each kind of ``models add`` is registered as.
REGISTRY_KIND = {"embeddings": registry.EMBEDDINGS_KIND, "chat": registry.CHAT_KIND,
               "completions": registry.COMPLETIONS_KIND}
OWNED_BY = "organization-owner"


@dataclass
class Added:
    model: Model
    notes: list[str]


def next_version(existing: list[Model]) -> str:
    """One more than the highest numeric version of the name ("1" for a new name)."""
    numbers = [int(m.version) for m in existing if m.version.isdigit()]
    return str(max(numbers, default=0) + 1)


def add(ctx: Context, name: str, source: str, kind: str, version: str | None = None,
        precision: str = registry.FP32, default: bool = False,
        allow_pickle: bool = False, engine: str = registry.AUTO,
        matryoshka: bool = False) -> Added:
    """Check the folder ``source`` for ``kind``, publish it as ``name``'s ``version``
    (the next number when None) and register it: the name's default with ``default``
    or when it is the name's first version, otherwise a version a rollout can send
    traffic to. ``matryoshka``: an embeddings model trained for shortened vectors (it
    serves ``dimensions``). Refused / InvalidRequest / Conflict (one line each) before anything is
    uploaded."""
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}", param="kind")
    if not registry.valid_segment(name):
        raise InvalidRequest(f"invalid model name {shown(name)}: use letters, digits, '.', "
                             "'_' and '-' (at most 200 characters)", param="name")
    if version is not None and not registry.valid_segment(version, 64):
        raise InvalidRequest(f"invalid model version {shown(version)}: use letters, digits, "
                             "'.', '_' and '-' (at most 64 characters)", param="version")
    if precision not in registry.PRECISIONS:
        raise InvalidRequest(f"precision must be one of {', '.join(registry.PRECISIONS)}",
                             param="precision")
    if engine not in registry.ENGINES:
        raise InvalidRequest(f"engine must be one of {', '.join(registry.ENGINES)}",
                             param="engine")
    if matryoshka and kind != "embeddings":
        raise InvalidRequest("only an embeddings model serves shortened vectors "
                             "(matryoshka)", param="matryoshka")
    if len(source) > 512:
        raise InvalidRequest("source is at most 512 characters", param="source")
    existing = registry.versions(ctx, name)
    served_as = REGISTRY_KIND[kind]
    if existing and existing[0].kind != served_as:
        raise Conflict(f"the versions of {name} are {existing[0].kind} models: a version "
                       f"of it cannot be {kind}", param="kind", code="model_kind_mismatch")
    version = version or next_version(existing)
    if any(m.version == version for m in existing):
        raise Conflict(f"{name}@{version} is already registered: pick another --version, or "
                       "remove it first", param="version", code="model_version_exists")
    folder = open_folder(source)
    checked = check(folder, kind, allow_pickle, engine, precision)
    with local_copy(folder, Path(ctx.settings.data_dir)) as src:
        model = publishing.publish_dir(ctx, name, version, served_as, folder.where, src,
                                       checked.context_length, OWNED_BY,
                                       precision=precision,
                                       default="this" if default else "keep",
                                       engine=engine, matryoshka=matryoshka)
    return Added(model, checked.notes)
