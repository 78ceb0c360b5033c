"""The model registry: public names, their versions, and each version's row.

A model version is a directory of files (weights, config, tokenizer) stored in
the object store under ``keys.model_prefix(name, version)``, plus a ``models``
row holding their manifest ({path, bytes, sha256} per file). Publishing
(jobs.fleet.publishing) uploads every file first and registers last, so a
registered version is always complete in the store. Workers materialize a
version on local disk (workers.models.cache) and load it from there.

Each name has one default version: the first registered, until another is made the
default (``--default``, ``inferq models default`` or a rollout's promotion). Requests
name a model by its public name and get the default version.

The registry is the catalog: which models exist and their kind are read from it
by validation (jobs.fleet.catalog); /v1/models and workers read the rest (context length,
files) from it too. Versions are named ``name@version`` (``ref``) in queues,
heartbeats and placement; a version may take a share of its name's traffic (a
canary), a mirror of it (a shadow), and keep a warm pool of resident copies.
The models this service knows how to import are jobs.fleet.builtin_models'.

No torch here.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from jobs.core.context import Context
from jobs.core.schema import Model, now
from storage import keys

# A chat model serves /v1/chat/completions and /v1/completions; a completions model (a
# generation model without a chat template) /v1/completions only.
EMBEDDINGS_KIND, CHAT_KIND, COMPLETIONS_KIND = "embeddings", "chat", "completions"
KINDS = (EMBEDDINGS_KIND, CHAT_KIND, COMPLETIONS_KIND)
# The precisions a version's weights are served in: fp32 anywhere; bf16 and fp16 on a
# GPU; int8 (dynamic quantization of the linear layers) on a CPU.
FP32 = "fp32"
PRECISIONS = (FP32, "bf16", "fp16", "int8")
# The engine a generation version runs on (workers.engines): vLLM's, inferq's own over
# transformers, or auto (vLLM where the worker has it and it serves the architecture and
# precision, else transformers). Embeddings run on their own engine whatever it says.
AUTO, TRANSFORMERS, VLLM = "auto", "transformers", "vllm"
ENGINES = (AUTO, TRANSFORMERS, VLLM)
# The longest context a version may declare, in tokens (16 Mi: past any model's; the
# column holds a 32-bit integer).
MAX_CONTEXT_LENGTH = 2**24
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Registrations made by this process: a snapshot of the registry read before the
# latest one (jobs.fleet.catalog's cache) is stale.
_registrations = itertools.count(1)
_last_registration = 0
T = TypeVar("T")


def version_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """Natural order of versions: "2" < "10", "1.2" < "1.10"; numbers before words."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p)
                 for p in re.split(r"[._-]", version))


def valid_segment(value: str, limit: int = 200) -> bool:
    """Whether ``value`` can be a model name or version."""
    return bool(_SEGMENT.fullmatch(value)) and len(value) <= limit


def check_segment(what: str, value: str, limit: int) -> None:
    if not _SEGMENT.fullmatch(value) or len(value) > limit:
        raise ValueError(f"invalid model {what} {value!r}: use letters, digits, '.', '_' "
                         f"and '-' (at most {limit} characters)")


def check_file_path(path: str) -> None:
    """Manifest paths are relative posix paths without '..' (they become local paths)."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..")
                                                                for p in parts):
        raise ValueError(f"invalid model file path {path!r}")


# Reads -----------------------------------------------------------------------------------


def get(ctx: Context, name: str, version: str) -> Model | None:
    with ctx.db.session() as s:
        return s.get(Model, (name, version))


def get_default(ctx: Context, name: str) -> Model | None:
    """The version served under ``name``; None when the name is not registered."""
    with ctx.db.session() as s:
        return s.scalar(select(Model).where(Model.name == name, Model.is_default))


def versions(ctx: Context, name: str) -> list[Model]:
    """Every registered version of ``name``, oldest first."""
    with ctx.db.session() as s:
        rows = list(s.scalars(select(Model).where(Model.name == name)))
    return sorted(rows, key=lambda m: version_key(m.version))


def all_versions(ctx: Context) -> list[Model]:
    """Every registered version, by name, then oldest first."""
    with ctx.db.session() as s:
        rows = list(s.scalars(select(Model)))
    return sorted(rows, key=lambda m: (m.name.lower(), m.name, version_key(m.version)))


def list_models(ctx: Context) -> list[Model]:
    """The default version of each registered name, by name (case-insensitively)."""
    with ctx.db.session() as s:
        return list(s.scalars(select(Model).where(Model.is_default)
                              .order_by(func.lower(Model.name), Model.name)))


def generation() -> int:
    """How many registrations this process has made; it changes with each one."""
    return _last_registration


class Snapshots(Generic[T]):
    """Something read from the registry (``load(ctx)``), kept per database for at most
    ``ttl_s``: another process's change is seen within that, one made by this process
    (a new ``generation``) at once."""

    def __init__(self, load: Callable[[Context], T], ttl_s: float) -> None:
        self.load, self.ttl_s = load, ttl_s
        self._lock = threading.Lock()
        # database url -> (when read, generation() when read, the snapshot)
        self._cache: dict[str, tuple[float, int, T]] = {}

    def get(self, ctx: Context, ttl_s: float | None = None) -> T:
        key, gen = ctx.settings.database_url, generation()
        ttl = self.ttl_s if ttl_s is None else ttl_s
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[1] == gen and time.monotonic() - hit[0] < ttl:
            return hit[2]
        fresh = self.load(ctx)
        with self._lock:
            self._cache[key] = (time.monotonic(), gen, fresh)
        return fresh

    def forget(self, ctx: Context) -> None:
        with self._lock:
            self._cache.pop(ctx.settings.database_url, None)


def total_bytes(model: Model) -> int:
    return sum(int(f["bytes"]) for f in model.files)


# Writes ----------------------------------------------------------------------------------


def register(ctx: Context, name: str, version: str, kind: str, source: str,
             files: list[dict[str, Any]], context_length: int, owned_by: str = "inferq",
             object_prefix: str | None = None, precision: str = FP32,
             default: str = "newest", engine: str = AUTO, tools: bool | None = None,
             matryoshka: bool = False) -> Model:
    """Insert or update (name, version); then the name's default is, by ``default``:
    ``newest``, its newest fp32 version (a version in another precision is never the
    default by being newer); ``this``, this version; ``keep``, the default it has (this
    version when it has none). ``tools``: its chat template renders tools (None: not
    known). ``matryoshka``: an embeddings model that serves ``dimensions``.

    Idempotent. The files must already be in the store under ``object_prefix``
    (default: the repository layout). Concurrent registrations of one name are
    serialized by a transaction-scoped advisory lock.
    """
    check_segment("name", name, 200)
    check_segment("version", version, 64)
    if kind not in KINDS:
        raise ValueError(f"invalid model kind {kind!r} (one of {', '.join(KINDS)})")
    if precision not in PRECISIONS:
        raise ValueError(f"invalid precision {precision!r} (one of {', '.join(PRECISIONS)})")
    if engine not in ENGINES:
        raise ValueError(f"invalid engine {engine!r} (one of {', '.join(ENGINES)})")
    if not 0 < context_length <= MAX_CONTEXT_LENGTH:
        raise ValueError(f"context_length must be from 1 to {MAX_CONTEXT_LENGTH} tokens")
    for f in files:
        check_file_path(f["path"])
    clean = [{"path": str(f["path"]), "bytes": int(f["bytes"]), "sha256": str(f["sha256"])}
             for f in files]
    values = {"kind": kind, "source": source,
              "object_prefix": object_prefix or keys.model_prefix(name, version),
              "files": clean, "context_length": int(context_length), "owned_by": owned_by,
              "precision": precision, "engine": engine, "tools": tools,
              "matryoshka": matryoshka}
    with ctx.db.session() as s:
        s.execute(select(func.pg_advisory_xact_lock(func.hashtext("inferq.models:" + name))))
        s.execute(pg_insert(Model)
                  .values(name=name, version=version, is_default=False, created_at=now(),
                          **values)
                  .on_conflict_do_update(index_elements=[Model.name, Model.version],
                                         set_=values))
        has_default = s.scalar(select(Model.version).where(Model.name == name,
                                                            Model.is_default))
        if default != "keep" or has_default is None:
            full = list(s.scalars(select(Model.version).where(Model.name == name,
                                                              Model.precision == FP32)))
            newest = (max(full, key=version_key) if default == "newest" and full
                      else version)
            # Two statements: the partial unique index is checked row by row.
            s.execute(update(Model)
                      .where(Model.name == name, Model.version != newest, Model.is_default)
                      .values(is_default=False))
            s.execute(update(Model).where(Model.name == name, Model.version == newest)
                      .values(is_default=True))
        model = s.get(Model, (name, version), populate_existing=True)
        assert model is not None
    _registered()
    return model


def derive(ctx: Context, name: str, base_version: str, version: str, precision: str,
           make_default: bool = False) -> Model:
    """Register ``version`` of ``name``: the files of ``base_version`` (shared, not
    copied) served in ``precision``; the default of the name only with
    ``make_default``. Idempotent; ValueError for an unknown base."""
    base = get(ctx, name, base_version)
    if base is None:
        raise ValueError(f"{name} has no version {base_version!r}")
    if version == base_version:
        raise ValueError("the derived version needs a version name of its own")
    return register(ctx, name, version, base.kind, f"{base.source} ({precision} of "
                    f"{base_version})", base.files, base.context_length, base.owned_by,
                    object_prefix=base.object_prefix, precision=precision,
                    default="this" if make_default else "keep", engine=base.engine,
                    tools=base.tools, matryoshka=base.matryoshka)


def set_default(ctx: Context, name: str, version: str) -> Model:
    """Make ``version`` the one served under ``name``; ValueError if it is not registered."""
    m = get(ctx, name, version)
    if m is None:
        raise ValueError(f"{name} has no version {version!r}")
    return register(ctx, name, version, m.kind, m.source, m.files, m.context_length,
                    m.owned_by, object_prefix=m.object_prefix, precision=m.precision,
                    default="this", engine=m.engine, tools=m.tools, matryoshka=m.matryoshka)


# Rollouts and warm pools -------------------------------------------------------------------


def _version_row(s: Any, name: str, version: str) -> Model:
    m = s.get(Model, (name, version), with_for_update=True)
    if m is None:
        raise ValueError(f"{name} has no version {version!r}")
    return m


def set_rollout(ctx: Context, name: str, version: str, weight: float | None = None,
                shadow: float | None = None) -> Model:
    """Give ``version`` (not the default) ``weight`` of the name's realtime requests and
    jobs (a canary) and/or mirror ``shadow`` of the default's realtime requests to it.
    Shares are in [0, 1]; the canaries of one name take at most all of its traffic."""
    for what, v in (("weight", weight), ("shadow", shadow)):
        if v is not None and not 0.0 <= v <= 1.0:
            raise ValueError(f"{what} must be between 0 and 1 (a share of requests)")
    with ctx.db.session() as s:
        s.execute(select(func.pg_advisory_xact_lock(func.hashtext("inferq.models:" + name))))
        m = _version_row(s, name, version)
        if m.is_default:
            raise ValueError(f"{name}@{version} is the default version: it takes the "
                             "traffic the canaries leave")
        if weight is not None:
            others = s.scalar(select(func.coalesce(func.sum(Model.traffic_weight), 0.0))
                              .where(Model.name == name, Model.version != version)) or 0.0
            if others + weight > 1.0 + 1e-9:
                raise ValueError(f"the canaries of {name} would take more than all of its "
                                 f"traffic ({others:g} is given to other versions)")
            m.traffic_weight = weight
        if shadow is not None:
            m.shadow_share = shadow
        s.flush()
        s.expunge(m)
    _registered()
    return m


def promote(ctx: Context, name: str, version: str) -> Model:
    """Make ``version`` the default, taking all of the name's traffic: every canary
    weight and shadow share of the name is cleared."""
    m = set_default(ctx, name, version)
    with ctx.db.session() as s:
        s.execute(update(Model).where(Model.name == name)
                  .values(traffic_weight=0.0, shadow_share=0.0))
    _registered()
    return m


def rollback(ctx: Context, name: str, version: str | None = None) -> list[str]:
    """Stop new traffic to ``version`` (every version of the name that has a canary
    weight or a shadow share, if None); the versions rolled back."""
    with ctx.db.session() as s:
        q = (update(Model).where(Model.name == name, (Model.traffic_weight > 0)
                                 | (Model.shadow_share > 0))
             .values(traffic_weight=0.0, shadow_share=0.0).returning(Model.version))
        if version is not None:
            _version_row(s, name, version)
            q = q.where(Model.version == version)
        out = sorted(s.scalars(q), key=version_key)
    _registered()
    return out


def set_pool(ctx: Context, name: str, version: str, min_resident: int | None = None,
             idle_unload_s: int | None = None, keep_forever: bool = False) -> Model:
    """The warm pool of a version: ``min_resident`` copies kept resident on live
    workers; an extra copy unused for ``idle_unload_s`` is unloaded (never, with
    ``keep_forever``)."""
    if min_resident is not None and min_resident < 0:
        raise ValueError("min_resident must be 0 or more")
    if idle_unload_s is not None and idle_unload_s < 1:
        raise ValueError("idle_unload_s must be at least 1 second")
    with ctx.db.session() as s:
        m = _version_row(s, name, version)
        if min_resident is not None:
            m.min_resident = min_resident
        if idle_unload_s is not None:
            m.idle_unload_s = idle_unload_s
        if keep_forever:
            m.idle_unload_s = None
        s.flush()
        s.expunge(m)
    _registered()
    return m


def unregister(ctx: Context, name: str, version: str,
               check: Callable[[Any, Model], None] | None = None) -> Model:
    """Delete the row of ``name``'s ``version`` under the name's lock, after ``check(session,
    row)`` (which refuses by raising) in the same transaction. ValueError when it is not
    registered. Its files in the store are the caller's to delete."""
    with ctx.db.session() as s:
        s.execute(select(func.pg_advisory_xact_lock(func.hashtext("inferq.models:" + name))))
        m = _version_row(s, name, version)
        if check is not None:
            check(s, m)
        s.delete(m)
        s.flush()
        s.expunge(m)
    _registered()
    return m


def _registered() -> None:
    global _last_registration
    _last_registration = next(_registrations)
