"""The model repository: a version's files uploaded, with their manifest, then registered.

``publish_dir`` uploads every file of a model directory under
``keys.model_prefix(name, version)``, then their sha256 manifest
(``keys.model_manifest``), and registers the version last (jobs.fleet.registry), so a
registered version is always complete in the store; a registration that fails removes
the files it would have named, so nothing is left published without a registry row.
Conversions that need torch (the GGUF chat model) live in workers.models.importers and
hand a finished directory to ``publish_dir``. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet.registry import (
    AUTO,
    CHAT_KIND,
    FP32,
    MAX_CONTEXT_LENGTH,
    check_file_path,
    check_segment,
    get,
    register,
)
from jobs.protocol.tools import chat_template, renders_tools
from storage import keys
from storage.objects import ObjectNotFound

log = logging.getLogger("inferq.models")


def sha256_file(path: Path, chunk: int = 1024 * 1024) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest(src: Path) -> list[dict[str, Any]]:
    """{path, bytes, sha256} for every regular file under ``src`` (dot-files, such as
    markers, left out), sorted by path."""
    out = []
    for p in sorted(src.rglob("*")):
        if p.is_file() and not p.is_symlink() and not p.name.startswith("."):
            rel = p.relative_to(src).as_posix()
            check_file_path(rel)
            out.append({"path": rel, "bytes": p.stat().st_size, "sha256": sha256_file(p)})
    if not out:
        raise ValueError(f"no files to publish under {src}")
    return out


def publish_dir(ctx: Context, name: str, version: str, kind: str, source: str, src: Path,
                context_length: int, owned_by: str = "inferq", reupload: bool = False,
                precision: str = FP32, default: str = "newest", engine: str = AUTO,
                matryoshka: bool = False) -> Model:
    """Upload a model directory into the repository, then register it (``precision``,
    ``default``, ``engine`` and ``matryoshka`` as ``register`` takes them).

    The files go first and their manifest last (``keys.model_manifest``). A store
    that already holds this version with the same manifest is complete, so its
    files are not uploaded again unless ``reupload``: registering a model in a
    second database on the same store costs no transfer. Re-publishing other
    content overwrites the files and removes objects under the prefix that the new
    manifest no longer lists. What can be checked before the upload is (names, the
    context length, the chat template); a registration that fails after it removes
    what this call uploaded (unless the version is registered), so a failed
    publication leaves nothing in the store.
    """
    check_segment("name", name, 200)
    check_segment("version", version, 64)
    if not 0 < context_length <= MAX_CONTEXT_LENGTH:
        raise ValueError(f"context_length must be from 1 to {MAX_CONTEXT_LENGTH} tokens")
    files = manifest(src)
    prefix = keys.model_prefix(name, version)
    record = keys.model_manifest(name, version)
    listing = json.dumps(files, sort_keys=True).encode()
    tools = renders_tools(chat_template(src)) if kind == CHAT_KIND else None
    uploaded = reupload or _stored_manifest(ctx, record) != listing
    if uploaded:
        try:
            _upload(ctx, name, version, src, files, prefix, record, listing)
        except BaseException:
            _unpublish(ctx, name, version, prefix, record)
            raise
    try:
        return register(ctx, name, version, kind, source, files, context_length, owned_by,
                        prefix, precision=precision, default=default, engine=engine,
                        tools=tools, matryoshka=matryoshka)
    except BaseException:
        if uploaded:
            _unpublish(ctx, name, version, prefix, record)
        raise


def _upload(ctx: Context, name: str, version: str, src: Path, files: list[dict[str, Any]],
            prefix: str, record: str, listing: bytes) -> None:
    ctx.store.delete(record)  # the files change below: the store is incomplete
    for f in files:
        with (src / f["path"]).open("rb") as fh:
            n = ctx.store.put_stream(keys.model_file(name, version, f["path"]), fh)
        if n != f["bytes"]:
            raise OSError(f"uploaded {n} of {f['bytes']} bytes of {f['path']}")
    listed = {prefix + f["path"] for f in files}
    for key in ctx.store.list(prefix):
        if key not in listed:
            ctx.store.delete(key)
    ctx.store.put_bytes(record, listing)


def _unpublish(ctx: Context, name: str, version: str, prefix: str, record: str) -> None:
    """Remove what a failed publication uploaded, unless the version is registered
    (a re-publication of a version, or another publication of it that registered
    meanwhile: its prefix is the registry's, and the next publication repairs it). A
    failure to remove is logged: the failure the caller sees is the publication's."""
    try:
        if get(ctx, name, version) is not None:
            return
    except Exception:  # noqa: BLE001 - the registry unreachable: nothing may name them
        log.warning("%s@%s: the registry could not be read after a failed publication; "
                    "removing its files", name, version)
    try:
        ctx.store.delete(record)
        ctx.store.delete_prefix(prefix)
    except Exception as e:  # noqa: BLE001
        log.warning("%s@%s: could not remove the files of a failed publication under %s: "
                    "%s", name, version, prefix, e)


def _stored_manifest(ctx: Context, record: str) -> bytes | None:
    try:
        return ctx.store.get_bytes(record)
    except ObjectNotFound:
        return None


def read_context_length(src: Path) -> int:
    """The serving window of a transformers model directory: sentence-transformers'
    max_seq_length when present, else the config's max_position_embeddings."""
    st = src / "sentence_bert_config.json"
    if st.exists() and (n := json.loads(st.read_text()).get("max_seq_length")):
        return int(n)
    return int(json.loads((src / "config.json").read_text())["max_position_embeddings"])
