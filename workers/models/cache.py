"""The worker-side model cache: a model version materialized on local disk.

``settings.data_dir / "model-cache" / <name> / <version>`` holds the version's
files exactly as listed in its manifest, plus ``.manifest.json`` (the manifest
it was built from). A directory is built under a temporary name next to its
final place, every file verified against its sha256, and only then renamed
into place: rename is atomic, so workers sharing a host either see a complete
directory or none, and a worker that loses the race to build it uses the
winner's.

A process that needs only a version's tokenizer (the control worker counting a batch's
prompt tokens) materializes the tokenizer's files alone, the same way, under
``settings.data_dir / "tokenizer-cache" / <name> / <version>`` (``tokenizer_dir``); a
host that already holds the whole version uses that copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet.registry import check_file_path
from storage.objects import CHUNK

log = logging.getLogger("inferq.models")

MANIFEST = ".manifest.json"
# What a tokenizer is loaded from (transformers' tokenizer files, any model family), at
# the top of a version's directory; never weights.
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "chat_template.jinja",
    "chat_template.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "config.json"})
TOKENIZER_DIRS = ("additional_chat_templates/",)


class CorruptModelFile(OSError):
    """A file read from the repository does not match its manifest."""


def cache_root(ctx: Context) -> Path:
    return Path(ctx.settings.data_dir) / "model-cache"


def cache_dir(ctx: Context, model: Model) -> Path:
    return cache_root(ctx) / model.name / model.version


def _normalized(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({"path": f["path"], "bytes": int(f["bytes"]), "sha256": f["sha256"]}
                   for f in files), key=lambda f: f["path"])


def tokenizer_cache_dir(ctx: Context, model: Model) -> Path:
    return Path(ctx.settings.data_dir) / "tokenizer-cache" / model.name / model.version


def tokenizer_files(model: Model) -> list[dict[str, Any]]:
    """The entries of ``model``'s manifest that its tokenizer is loaded from."""
    return [f for f in model.files
            if f["path"] in TOKENIZER_FILES or f["path"].startswith(TOKENIZER_DIRS)]


def is_complete(path: Path, model: Model, files: list[dict[str, Any]] | None = None) -> bool:
    """The directory was built from this manifest (``files``: the part of
    ``model.files`` it holds; all of them when None) and every file has its size.

    Sizes only: contents were verified when the directory was built, and hashing
    hundreds of megabytes on every worker start is what this cache avoids.
    """
    try:
        recorded = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    files = _normalized(model.files if files is None else files)
    if recorded != files:
        return False
    try:
        return all((path / f["path"]).stat().st_size == f["bytes"] for f in files)
    except OSError:
        return False


def _fetch(ctx: Context, model: Model, f: dict[str, Any], root: Path) -> None:
    check_file_path(f["path"])
    dest = root / f["path"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    n = 0
    with ctx.store.open(model.object_prefix + f["path"]) as src, dest.open("wb") as out:
        while block := src.read(CHUNK):
            h.update(block)
            out.write(block)
            n += len(block)
    if n != int(f["bytes"]) or h.hexdigest() != f["sha256"]:
        raise CorruptModelFile(f"{model.name}/{model.version}: {f['path']} does not match its "
                               f"manifest ({n} bytes, sha256 {h.hexdigest()[:12]}…)")


def local_dir(ctx: Context, model: Model) -> Path:
    """A complete local copy of ``model``'s files; downloads it unless already present."""
    final = cache_dir(ctx, model)
    if not is_complete(final, model):
        _materialize(ctx, model, model.files, final)
        log.info("model %s/%s cached at %s", model.name, model.version, final)
    return final


def tokenizer_dir(ctx: Context, model: Model) -> Path:
    """A local directory holding ``model``'s tokenizer files (hashes checked): the whole
    version's copy when this host has one, else a copy of those files alone, which
    downloads them unless already present. FileNotFoundError when the manifest lists
    no tokenizer file."""
    full = cache_dir(ctx, model)
    if is_complete(full, model):
        return full
    files = tokenizer_files(model)
    if not files:
        raise FileNotFoundError(f"{model.name}/{model.version} lists no tokenizer files")
    final = tokenizer_cache_dir(ctx, model)
    if not is_complete(final, model, files):
        _materialize(ctx, model, files, final)
        log.info("tokenizer of %s/%s cached at %s", model.name, model.version, final)
    return final


def _materialize(ctx: Context, model: Model, files: list[dict[str, Any]], final: Path) -> None:
    """Download ``files`` (entries of ``model``'s manifest) into ``final``: built under a
    temporary name, each file checked against its hash, then renamed into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _sweep(final.parent)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{model.version}-"))
    try:
        for f in files:
            _fetch(ctx, model, f, tmp)
        (tmp / MANIFEST).write_text(json.dumps(_normalized(files)))
        tmp.chmod(0o755)  # mkdtemp makes it private; workers may run as other users
        _install(tmp, final, model, files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sweep(parent: Path, older_than_s: float = 6 * 3600) -> None:
    """Remove build directories left behind by workers that died mid-download."""
    cutoff = time.time() - older_than_s
    for p in parent.glob(".*-*"):
        if p.name.startswith((".tmp-", ".stale-")):
            try:
                if p.stat().st_mtime < cutoff:
                    shutil.rmtree(p, ignore_errors=True)
            except FileNotFoundError:
                pass


def _install(tmp: Path, final: Path, model: Model, files: list[dict[str, Any]]) -> None:
    """Rename ``tmp`` to ``final``; replace a stale ``final`` (an older manifest)."""
    for _ in range(3):
        try:
            os.rename(tmp, final)
            return
        except OSError:  # final exists: someone else built it, or it is stale
            if is_complete(final, model, files):
                return
            stale = final.with_name(f".stale-{final.name}-{os.getpid()}-{os.urandom(3).hex()}")
            try:
                os.rename(final, stale)
            except FileNotFoundError:
                continue
            shutil.rmtree(stale, ignore_errors=True)
    raise OSError(f"could not install {final}")
