"""Pipeline efficiency: a batch through the whole service vs the raw in-process loop.

e2e: upload JSONL → batch → validate + shard → one model worker → finalize →
download the output file, through the openai SDK against the API (embedded
default stack: PostgreSQL and Redis from their wheels, a file:// store).
raw: the same model, inputs and batch policy in a tight loop in this process
(tokenize, plan, embed); no I/O. Rounds alternate raw, e2e, raw, e2e.
Workload: bench.workload.texts(N, seed=0).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import free_port, report, spread
from bench.workload import texts, write_embeddings_jsonl


def raw_loop(model, policy, inputs: list[str]) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    ids = model.tokenize(inputs)
    for b in policy.plan([len(x) for x in ids]):
        model.embed([ids[i] for i in b])
    return time.perf_counter() - t0


def e2e(client, path: Path, n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    with path.open("rb") as fh:
        f = client.files.create(file=(path.name, fh), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    while b.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.25)
        b = client.batches.retrieve(b.id)
    assert b.status == "completed" and b.request_counts.completed == n, b
    out = client.files.content(b.output_file_id).read()
    dt = time.perf_counter() - t0
    assert out.count(b"\n") == n
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from openai import OpenAI

    from cli.stack import Stack
    from jobs.settings import Settings
    from workers.batching import BatchPolicy
    from workers.runtime.embeddings import EmbeddingModel

    items = [t for _, t in texts(args.n, seed=0)]
    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port())
        path = Path(tmp) / "input.jsonl"
        write_embeddings_jsonl(path, texts(args.n, seed=0))
        model = EmbeddingModel(st.embedding_model)
        policy = BatchPolicy(st.max_batch_tokens, st.max_batch_rows)
        raw_loop(model, policy, items[:64])  # warm-up
        with Stack(st) as stack:
            client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key)
            warm = Path(tmp) / "warm.jsonl"
            write_embeddings_jsonl(warm, texts(200, seed=1))
            e2e(client, warm, 200)  # the worker's first batches pay one-off costs
            raw_t, e2e_t = [], []
            for _ in range(args.rounds):
                raw_t.append(raw_loop(model, policy, items))
                e2e_t.append(e2e(client, path, args.n))
    ratios = [r / e for r, e in zip(raw_t, e2e_t, strict=True)]
    rows = [["raw in-process loop", spread([args.n / t for t in raw_t])],
            ["e2e through inferq", spread([args.n / t for t in e2e_t])],
            ["e2e ÷ raw throughput", spread(ratios)]]
    report("pipeline", f"pipeline efficiency, {args.n} embeddings requests, one worker",
           ["side", "texts/s (median [range])"], rows,
           {"n": args.n, "rounds": args.rounds, "raw_seconds": raw_t, "e2e_seconds": e2e_t,
            "ratio": ratios, "shard_rows": st.shard_rows, "chunk_rows": st.chunk_rows})


if __name__ == "__main__":
    main()
