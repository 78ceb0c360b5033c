"""What the service serves, as request validation sees it: the default version of each
registered model (its name and kind), read from the registry.

The registry (PostgreSQL ``models``) is the only source: a model registered there is
accepted by validation and listed by /v1/models. Validation reads a snapshot once
per batch (``load``) or, in the API process, through a short TTL cache (``cached``)
so a request never costs a registry query of its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from jobs.core.context import Context
from jobs.core.errors import MODEL_NOT_FOUND, InvalidRequest, shown
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
    """A snapshot of the registry's default versions, looked up by name."""

    def __init__(self, models: Iterable[ModelInfo]) -> None:
        self.models = {m.name: m for m in models}

    def names(self, kind: str | None = None) -> list[str]:
        """Registered names (of one kind, if given), sorted case-insensitively."""
        return sorted((m.name for m in self.models.values() if kind in (None, m.kind)),
                      key=lambda n: (n.lower(), n))

    def require(self, name: str, endpoint: str, param: str = "model") -> ModelInfo:
        """The model ``name`` if it serves ``endpoint``; else an InvalidRequest whose
        message lists the models that do (``name`` quoted and cut short: it is the
        client's text, and the message may be stored)."""
        kinds = kinds_for(endpoint)
        m = self.models.get(name)
        if m is not None and m.kind in kinds:
            return m
        available = sorted({n for k in kinds for n in self.names(k)},
                           key=lambda n: (n.lower(), n))
        listed = ", ".join(available) if available else "none is registered"
        article = "an" if m is not None and m.kind[:1] in "aeiou" else "a"
        what = ("does not exist" if m is None
                else f"is {article} {m.kind} model, not for {endpoint}")
        raise InvalidRequest(f"The model {shown(name)} {what}. Models for {endpoint}: {listed}",
                             param=param, code=MODEL_NOT_FOUND)


def load(ctx: Context) -> Catalog:
    """The registry's default versions now (one query)."""
    return Catalog(ModelInfo(m.name, m.kind, m.tools, m.matryoshka)
                   for m in registry.list_models(ctx))


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
