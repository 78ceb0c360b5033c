"""The model repository: a version's files uploaded, with their manifest, then registered.

``publish_dir`` uploads every file of a model directory under
``keys.model_prefix(name, version)``, then their sha256 manifest
(``keys.model_manifest``), and registers the version last (jobs.fleet.registry), so a
registered version is always complete in the store. Conversions that need torch
(the GGUF chat model) live in workers.models.importers and hand a finished
directory to ``publish_dir``. No torch here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet.registry import AUTO, CHAT_KIND, FP32, check_file_path, check_segment, register
from jobs.protocol.tools import chat_template, renders_tools
from storage import keys
from storage.objects import ObjectNotFound


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
    manifest no longer lists.
    """
    check_segment("name", name, 200)
    check_segment("version", version, 64)
    files = manifest(src)
    prefix = keys.model_prefix(name, version)
    record = keys.model_manifest(name, version)
    listing = json.dumps(files, sort_keys=True).encode()
    if reupload or _stored_manifest(ctx, record) != listing:
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
    tools = renders_tools(chat_template(src)) if kind == CHAT_KIND else None
    return register(ctx, name, version, kind, source, files, context_length, owned_by, prefix,
                    precision=precision, default=default, engine=engine, tools=tools,
                    matryoshka=matryoshka)


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
