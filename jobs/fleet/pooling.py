"""How an embeddings model's token states become one vector: its folder's pooling.

A sentence-transformers folder (``modules.json``) keeps its pooling (mean, cls, max or
lasttoken, from the Pooling module's ``config.json``) and its normalisation (a
Normalize module: L2); a module the embedding engine does not apply (Dense, LayerNorm,
a Transformer in a subfolder, ...) is refused. A plain encoder is served with mean
pooling and L2 normalisation. ``read_pooling`` is what ``models add`` checks and what
the worker reads at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jobs.core.errors import shown
from jobs.fleet.folders import Folder, LocalFolder, Refused, read_json, read_object

POOLINGS = ("mean", "cls", "max", "lasttoken")
# modules.json's types by their class name (sentence-transformers 2-5 write
# ``sentence_transformers.models.Pooling``, 6 ``sentence_transformers.<…>.pooling.Pooling``).
ST_TRANSFORMER, ST_POOLING, ST_NORMALIZE = "Transformer", "Pooling", "Normalize"


@dataclass(frozen=True)
class Pooling:
    """How token states become one embedding: ``mode`` (mean | cls | max | lasttoken)
    and whether the result is L2-normalised; ``declared``: read from the folder's
    sentence-transformers modules (False: the default for a plain encoder)."""

    mode: str = "mean"
    normalize: bool = True
    declared: bool = False

    def describe(self) -> str:
        how = f"{self.mode} pooling" + (" + L2 normalisation" if self.normalize
                                        else ", not normalised")
        if self.declared:
            return f"embeddings: {how} (the folder's sentence-transformers modules)"
        return f"embeddings: a plain encoder, served with {how}"


DEFAULT_POOLING = Pooling()


def read_pooling(folder: Folder | Path) -> Pooling:
    """The pooling a folder's sentence-transformers modules ask for; mean + L2 for a
    folder without ``modules.json`` (a plain encoder). Refused for a module or a
    pooling mode the embedding engine does not apply."""
    if isinstance(folder, Path):
        folder = LocalFolder(folder)
    if not folder.has("modules.json"):
        return DEFAULT_POOLING
    modules = read_json(folder, "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise Refused("modules.json is not a list of modules")
    mode, normalize = "mean", False
    for m in modules:
        kind, path = str(m.get("type", "")).rsplit(".", 1)[-1], str(m.get("path", ""))
        if kind == ST_TRANSFORMER:
            if path.strip("/"):
                raise Refused(f"modules.json puts the Transformer in {shown(path)}: the "
                              "embedding engine loads it from the folder's top")
        elif kind == ST_POOLING:
            mode = _pooling_mode(folder, path.strip("/"))
        elif kind == ST_NORMALIZE:
            normalize = True
        else:
            raise Refused(f"modules.json lists a {shown(kind or 'unnamed')} module "
                          f"({shown(path)}), which the embedding engine does not apply")
    return Pooling(mode, normalize, declared=True)


def _pooling_mode(folder: Folder, path: str) -> str:
    rel = f"{path}/config.json" if path else "config.json"
    if not folder.has(rel):
        raise Refused(f"modules.json names a Pooling module but {rel} is missing")
    cfg = read_object(folder, rel)
    named = cfg.get("pooling_mode")
    if isinstance(named, str | list):
        modes = [str(x).replace("_tokens", "").replace("_token", "")
                 for x in ([named] if isinstance(named, str) else named)]
    else:
        modes = [k.removeprefix("pooling_mode_").replace("_tokens", "").replace("_token", "")
                 for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        asked = " + ".join(modes) or "no"
        raise Refused(f"{rel} asks for {asked} pooling; served: one of {', '.join(POOLINGS)}")
    return modes[0]
