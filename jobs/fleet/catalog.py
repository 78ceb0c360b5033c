"""What the service serves, as request validation sees it: the default version of each
registered model (its name and kind) and every version by its ``name@version``, read
from the registry.

A request names a model (its default version, or a canary taking its share:
jobs.fleet.rollout) or one version of it, ``name@version``. A version is named in
realtime requests, jobs and batches (a batch runs on the version its lines name, else
on its model's default version, pinned when it is validated); a caller that takes
only a model's name checks with ``versions=False``.

The registry (PostgreSQL ``models``) is the only source: a model registered there is
accepted by validation and listed by /v1/models. Validation reads a snapshot once
per batch (``load``) or, in the API process, through a short TTL cache (``cached``)
so a request never costs a registry query of its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from jobs.core import refs
from jobs.core.context import Context
from jobs.core.errors import MODEL_NOT_FOUND, InvalidRequest, shown
from jobs.core.schema import Model
from jobs.fleet import registry
from jobs.protocol.endpoints import COMPLETIONS, EMBEDDINGS, RESPONSES, ModelInfo

TTL_S = 5.0


def kinds_for(endpoint: str) -> tuple[str, ...]:
    """The model kinds that serve ``endpoint``."""
    if endpoint == EMBEDDINGS:
        return (registry.EMBEDDINGS_KIND,)
    if endpoint == COMPLETIONS:
        return (registry.CHAT_KIND, registry.COMPLETIONS_KIND)
    if endpoint == RESPONSES:  # run as a chat request: a chat model's
        return (registry.CHAT_KIND,)
    return (registry.CHAT_KIND,)


class Catalog:
    """A snapshot of the registry's default versions, looked up by name, and of every
    version, by ``name@version`` (``versions``: each ModelInfo named by its ref)."""

    def __init__(self, models: Iterable[ModelInfo],
                 versions: Iterable[ModelInfo] = ()) -> None:
        self.models = {m.name: m for m in models}
        self.versions = {v.name: v for v in versions}

    def names(self, kind: str | None = None) -> list[str]:
        """Registered names (of one kind, if given), sorted case-insensitively."""
        return sorted((m.name for m in self.models.values() if kind in (None, m.kind)),
                      key=lambda n: (n.lower(), n))

    def require(self, name: str, endpoint: str, param: str = "model",
                versions: bool = False) -> ModelInfo:
        """The model ``name`` if it serves ``endpoint``; else an InvalidRequest whose
        message lists the models that do (``name`` quoted and cut short: it is the
        client's text, and the message may be stored). With ``versions``, ``name`` may
        also be one version, ``name@version`` (an unknown one: the same error, naming
        the versions that exist)."""
        kinds = kinds_for(endpoint)
        base, version = refs.split_ref(name)
        if version is not None and versions and base in self.models:
            return self._version(name, base, version, endpoint, param)
        m = self.models.get(name)
        if m is not None and m.kind in kinds:
            return m
        available = sorted({n for k in kinds for n in self.names(k)},
                           key=lambda n: (n.lower(), n))
        listed = ", ".join(available) if available else "none is registered"
        article = "an" if m is not None and m.kind[:1] in "aeiou" else "a"
        what = ("does not exist" if m is None
                else f"is {article} {m.kind} model, not for {endpoint}")
        if version is not None and not versions and base in self.models:
            what += " (name the model here, not one of its versions)"
        raise InvalidRequest(f"The model {shown(name)} {what}. Models for {endpoint}: {listed}",
                             param=param, code=MODEL_NOT_FOUND)

    def _version(self, ref: str, name: str, version: str, endpoint: str,
                 param: str) -> ModelInfo:
        v = self.versions.get(ref)
        if v is None:
            have = sorted((r.rpartition("@")[2] for r in self.versions
                           if refs.split_ref(r)[0] == name), key=registry.version_key)
            raise InvalidRequest(
                f"The model {shown(name)} has no version {shown(version)}. Its versions: "
                f"{', '.join(have) or 'none'} (name one as {name}@VERSION)",
                param=param, code=MODEL_NOT_FOUND)
        self.require(name, endpoint, param)  # its versions are all of the name's kind
        return v


def load(ctx: Context) -> Catalog:
    """The registry's versions now (one query)."""
    st = ctx.settings  # a prompt's bytes: bounded by the model's context (jobs.protocol.limits)
    every = registry.all_versions(ctx)

    def info(m: Model, name: str) -> ModelInfo:
        return ModelInfo(name, m.kind, m.tools, m.matryoshka, min(
            st.max_prompt_bytes, m.context_length * st.prompt_bytes_per_token))

    defaults = sorted((m for m in every if m.is_default),
                      key=lambda m: (m.name.lower(), m.name))
    return Catalog([info(m, m.name) for m in defaults],
                   [info(m, refs.model_ref(m.name, m.version)) for m in every])


_snapshots = registry.Snapshots(load, TTL_S)


def cached(ctx: Context, ttl_s: float = TTL_S) -> Catalog:
    """``load`` at most once per ``ttl_s`` per database: for per-request validation in
    the API. A model registered by another process is seen within ``ttl_s``; one
    registered by this process, at once."""
    return _snapshots.get(ctx, ttl_s)


def invalidate(ctx: Context) -> None:
    """Forget the cached snapshot (after the registry was changed other than by
    ``registry.register`` in this process)."""
    _snapshots.forget(ctx)
