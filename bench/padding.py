"""Padding efficiency: the engine's length-bucketed, token-budget batches vs
fixed-size batches in arrival order, on the same long-tailed texts, same model.

Workload: bench.workload.texts(N, seed=0) (Pareto sentence counts: median 8
words, max ~190). Rounds alternate A B A B; the table gives medians and ranges.
"""

from __future__ import annotations

import argparse
import time

from bench.common import report, spread
from bench.workload import texts
from workers.engines.batching import BatchPolicy, arrival_order, padding_stats


def run_batches(model, ids: list[list[int]], batches: list[list[int]]) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for b in batches:
        model.embed([ids[i] for i in b])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arrival-rows", type=int, default=64)
    args = ap.parse_args()

    from jobs.core.settings import Settings
    from workers.models.embeddings import EmbeddingModel

    st = Settings.from_env()
    model = EmbeddingModel("all-MiniLM-L6-v2")
    ids = model.tokenize([t for _, t in texts(args.n, seed=0)])
    lengths = [len(x) for x in ids]
    policy = BatchPolicy(st.max_batch_tokens, st.max_batch_rows)
    engine_b = policy.plan(lengths)
    arrival_b = arrival_order(lengths, args.arrival_rows)
    run_batches(model, ids, engine_b[:3])  # warm-up
    times: dict[str, list[float]] = {"engine": [], "arrival": []}
    for _ in range(args.rounds):
        times["engine"].append(run_batches(model, ids, engine_b))
        times["arrival"].append(run_batches(model, ids, arrival_b))
    rows, data = [], {"n": args.n, "rounds": args.rounds, "policy": policy.__dict__}
    for name, batches in (("engine", engine_b), ("arrival", arrival_b)):
        real, computed = padding_stats(lengths, batches)
        tput = [args.n / t for t in times[name]]
        rows.append([name, len(batches), f"{real / computed:.3f}", spread(tput)])
        data[name] = {"batches": len(batches), "real_tokens": real, "computed_tokens": computed,
                      "seconds": times[name], "texts_per_s": tput}
    ratios = [a / e for e, a in zip(times["engine"], times["arrival"], strict=True)]
    data["throughput_ratio"] = ratios
    rows.append(["engine ÷ arrival throughput", "", "", spread(ratios)])
    report("padding", f"padding efficiency, {args.n} long-tailed texts, all-MiniLM-L6-v2",
           ["batching", "micro-batches", "real ÷ computed tokens", "texts/s (median [range])"],
           rows, data)


if __name__ == "__main__":
    main()
