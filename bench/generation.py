"""Engine generation throughput: inferq's continuous-batching engine vs transformers
``generate`` in static batches of the engine's batch size, same prompts, greedy.

Workload: N chat prompts built from bench.workload topics (seed 0), max_new_tokens
fixed; both sides count only real generated tokens (up to EOS or the limit).
Rounds alternate engine, generate, engine, generate.
"""

from __future__ import annotations

import argparse
import random
import threading
import time

import torch

from bench.common import report, spread
from bench.workload import TOPICS, sentence

QUESTIONS = ["Summarize this: {s}", "What happens next? {s}", "Rewrite politely: {s}",
             "Is this good news? {s}", "Explain to a child: {s}"]


def prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    names = sorted(TOPICS)
    out = []
    for _ in range(n):
        s = " ".join(sentence(rng, rng.choice(names)) for _ in range(rng.randint(1, 4)))
        out.append([{"role": "user", "content": rng.choice(QUESTIONS).format(s=s)}])
    return out


def run_engine(engine, reqs) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from workers.generation import Collect

    sinks = [Collect() for _ in reqs]
    done = threading.Semaphore(0)
    for s in sinks:
        s.on_done = lambda _: done.release()
    t0 = time.perf_counter()
    for r, s in zip(reqs, sinks, strict=True):
        engine.submit(r, s, 2)
    for _ in sinks:
        done.acquire()
    dt = time.perf_counter() - t0
    return dt, sum(s.result().usage.completion_tokens for s in sinks)


@torch.inference_mode()
def run_generate(model, prompt_ids: list[list[int]], batch: int, new: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    m = model.model
    eos = model.eos_ids
    tokens = 0
    t0 = time.perf_counter()
    for i in range(0, len(prompt_ids), batch):
        group = prompt_ids[i: i + batch]
        width = max(map(len, group))
        ids = torch.full((len(group), width), model.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(group):
            ids[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        out = m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                         do_sample=False, pad_token_id=model.pad_id)
        for row in out[:, width:].tolist():
            n = 0
            for t in row:
                if t in eos:
                    break
                n += 1
            tokens += n
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from jobs.settings import Settings
    from workers.generation import GenerationEngine
    from workers.generation_request import GenRequest
    from workers.runtime.chat import ChatModel
    from workers.runtime.importers import converted_dir, smollm2_gguf

    st = Settings.from_env()
    path = converted_dir(st.cache_dir, "SmolLM2-135M-Instruct", "1", smollm2_gguf())
    model = ChatModel("SmolLM2-135M-Instruct", path)
    ids = [model.chat_ids(p) for p in prompts(args.n)]
    engine = GenerationEngine(model, max_batch_rows=args.batch, max_rows=args.batch)
    reqs = [GenRequest(prompt=p, max_new_tokens=args.new_tokens, temperature=0) for p in ids]
    run_engine(engine, reqs[:4])  # warm-up
    run_generate(model, ids[:4], 4, 4)
    res: dict[str, list[tuple[float, int]]] = {"engine": [], "generate": []}
    for _ in range(args.rounds):
        res["engine"].append(run_engine(engine, reqs))
        res["generate"].append(run_generate(model, ids, args.batch, args.new_tokens))
    engine.stop()
    tput = {k: [tok / dt for dt, tok in v] for k, v in res.items()}
    ratio = [e / g for e, g in zip(tput["engine"], tput["generate"], strict=True)]
    rows = [["inferq engine (continuous batching)", spread(tput["engine"]),
             res["engine"][0][1]],
            ["transformers generate (static batches)", spread(tput["generate"]),
             res["generate"][0][1]],
            ["engine ÷ generate", spread(ratio), ""]]
    report("generation", f"generation throughput, {args.n} chat prompts, batch {args.batch}, "
           f"{args.new_tokens} new tokens, SmolLM2-135M-Instruct greedy",
           ["side", "tokens/s (median [range])", "tokens generated"], rows,
           {"n": args.n, "batch": args.batch, "new_tokens": args.new_tokens,
            "rounds": args.rounds, "seconds_tokens": res, "tokens_per_s": tput,
            "ratio": ratio})


if __name__ == "__main__":
    main()
