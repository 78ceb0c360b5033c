"""Precision options against fp32, per model: speed and quality, same run.

- Embeddings (all-MiniLM-L6-v2): N texts from bench.workload (seed 0) embedded in
  micro-batches of --batch through ``EmbeddingModel.embed`` (the worker's forward pass).
  Speed: texts/s; quality: cosine similarity of each text's embedding to its fp32 one
  (mean and least).
- Chat (SmolLM2-135M-Instruct): M chat prompts (bench.generation, seed 0), greedy,
  --new-tokens each, through the worker's ``GenerationEngine``. Speed: generated
  tokens/s; quality: the share of prompts whose greedy output is identical to fp32's,
  and the mean share of leading tokens that agree.

Precisions measured: those this machine's device serves (fp32 and int8 on a CPU; fp32,
bf16 and fp16 on a GPU). Rounds alternate fp32 and the option; the ratio is per round.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np
import torch

from bench import twins
from bench.common import report, spread
from bench.generation import Row, prompts, run_engine
from bench.workload import TOPICS, sentence


def options() -> list[str]:
    return ["bf16", "fp16"] if torch.cuda.is_available() else ["int8"]


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    names = sorted(TOPICS)
    return [" ".join(sentence(rng, rng.choice(names)) for _ in range(rng.randint(1, 6)))
            for _ in range(n)]


def embed_all(model: Any, ids: list[list[int]], batch: int) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    out = [model.embed(ids[i: i + batch]) for i in range(0, len(ids), batch)]
    return time.perf_counter() - t0, np.concatenate(out)


def embeddings(args: argparse.Namespace) -> list[list[Any]]:
    from workers.models.embeddings import EmbeddingModel

    name = "all-MiniLM-L6-v2"
    base = EmbeddingModel(name, twins.embedding_path())
    ids = base.tokenize(texts(args.n))
    rows = []
    for p in options():
        other = EmbeddingModel(name, twins.embedding_path(), precision=p)
        embed_all(base, ids[:8], 8), embed_all(other, ids[:8], 8)  # warm-up
        ratios: list[float] = []
        speeds: dict[str, list[float]] = {"fp32": [], p: []}
        cos = np.zeros(0)
        for _ in range(args.rounds):
            dt0, ref = embed_all(base, ids, args.batch)
            dt1, got = embed_all(other, ids, args.batch)
            speeds["fp32"].append(len(ids) / dt0)
            speeds[p].append(len(ids) / dt1)
            ratios.append(dt0 / dt1)
            cos = (ref * got).sum(axis=1)  # both L2-normalised
        rows.append([name, p, spread(speeds["fp32"]), spread(speeds[p]), spread(ratios),
                     f"cosine to fp32: mean {cos.mean():.4f}, least {cos.min():.4f}"])
    return rows


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[float, float]:
    same = sum(1 for a, b in zip(ref, got, strict=True) if a == b) / len(ref)
    lead = []
    for a, b in zip(ref, got, strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                 min(len(a), len(b)))
        lead.append(k / max(len(a), 1))
    return same, sum(lead) / len(lead)


def chat(args: argparse.Namespace) -> list[list[Any]]:
    from workers.engines.generation.engine import GenerationEngine
    from workers.engines.request import GenRequest
    from workers.engines.sinks import Collect
    from workers.models.chat import ChatModel

    name = "SmolLM2-135M-Instruct"
    path = twins.chat_path()

    def outputs(engine: GenerationEngine, reqs: list[GenRequest]) -> list[list[int]]:
        sinks = [Collect() for _ in reqs]
        for r, s in zip(reqs, sinks, strict=True):
            engine.submit(r, s, 2)
        return [base.tokenizer.encode(s.result(timeout=600).text, add_special_tokens=False)
                for s in sinks]

    base = ChatModel(name, path)
    ids = [base.chat_ids(p) for p in prompts(args.chat_n)]
    reqs = [GenRequest(prompt=p, max_new_tokens=args.new_tokens, temperature=0) for p in ids]
    timed = [Row(p, args.new_tokens) for p in ids]
    rows = []
    e0 = GenerationEngine(base, max_batch_rows=args.chat_batch, max_rows=args.chat_batch)
    try:
        ref = outputs(e0, reqs)
        for p in options():
            e1 = GenerationEngine(ChatModel(name, path, precision=p),
                                  max_batch_rows=args.chat_batch, max_rows=args.chat_batch)
            try:
                got = outputs(e1, reqs)
                speeds: dict[str, list[float]] = {"fp32": [], p: []}
                ratios = []
                for _ in range(args.rounds):
                    dt0, tok0 = run_engine(e0, timed)
                    dt1, tok1 = run_engine(e1, timed)
                    speeds["fp32"].append(tok0 / dt0)
                    speeds[p].append(tok1 / dt1)
                    ratios.append((tok1 / dt1) / (tok0 / dt0))
                same, lead = agreement(ref, got)
                rows.append([name, p, spread(speeds["fp32"]), spread(speeds[p]),
                             spread(ratios), f"greedy outputs identical to fp32: "
                             f"{same:.0%}; leading tokens agreeing: {lead:.0%}"])
            finally:
                e1.stop()
    finally:
        e0.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=512, help="texts to embed")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--chat-n", type=int, default=32, help="chat prompts")
    ap.add_argument("--chat-batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = embeddings(args) + chat(args)
    report("precision", f"precision options against fp32{twins.label()} (speed ratio = "
           "option ÷ fp32, same run)", ["model", "precision", "fp32 /s", "option /s", "speed ratio",
                         "quality"], rows, {"args": vars(args)})


if __name__ == "__main__":
    main()
