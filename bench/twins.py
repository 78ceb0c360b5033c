"""Twins of the builtin models: each builtin's own config and tokenizer with random
weights (seed 0), for a machine where the packaged weights are not installed (a GPU
machine that takes files only by a small upload). A twin computes exactly what its
builtin computes, so speed figures hold; what its text says does not, and greedy rows
seldom stop at EOS, so generation counts more tokens per row than the builtin would.

    python -m bench.twins pack DIR     # here: each builtin's config and tokenizer, no weights
    python -m bench.twins build DIR    # there: random weights into each folder of DIR

With ``INFERQ_BENCH_TWINS=DIR`` set, the benchmarks load the twins in DIR instead of the
builtins (``chat_path``, ``embedding_path``) and say so in their titles.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

CHAT = "SmolLM2-135M-Instruct"
EMBEDDINGS = "all-MiniLM-L6-v2"
WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt")


def twins_dir() -> Path | None:
    d = os.environ.get("INFERQ_BENCH_TWINS")
    return Path(d) if d else None


def label() -> str:
    """What a benchmark's title says about the weights it ran."""
    return " (random-weight twins: speed only)" if twins_dir() else ""


def chat_path() -> Path:
    d = twins_dir()
    if d is not None:
        return d / CHAT
    from jobs.core.settings import Settings
    from workers.models.importers import converted_dir, smollm2_gguf
    return converted_dir(Settings.from_env().cache_dir, CHAT, "1", smollm2_gguf())


def embedding_path() -> Path:
    d = twins_dir()
    if d is not None:
        return d / EMBEDDINGS
    from workers.models.embeddings import packaged_path
    return packaged_path(EMBEDDINGS)


def pack(out: Path) -> None:
    from jobs.core.settings import Settings
    from workers.models.embeddings import packaged_path
    from workers.models.importers import converted_dir, smollm2_gguf

    chat = converted_dir(Settings.from_env().cache_dir, CHAT, "1", smollm2_gguf())
    for name, src in ((CHAT, chat), (EMBEDDINGS, packaged_path(EMBEDDINGS))):
        dst = out / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=lambda _d, names: [
            n for n in names if n.endswith(WEIGHTS) or n.startswith(".")])


def build(root: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    for name, cls in ((CHAT, AutoModelForCausalLM), (EMBEDDINGS, AutoModel)):
        d = root / name
        if (d / "model.safetensors").exists():
            continue
        torch.manual_seed(0)
        model = cls.from_config(AutoConfig.from_pretrained(str(d)), dtype=torch.float32)
        model.save_pretrained(str(d))
        print(f"{d}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M random "
              "parameters")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["pack", "build"])
    ap.add_argument("dir", type=Path)
    args = ap.parse_args()
    (pack if args.what == "pack" else build)(args.dir)


if __name__ == "__main__":
    main()
