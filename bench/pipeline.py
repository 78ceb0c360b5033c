"""Pipeline efficiency: a batch through the whole service vs the raw in-process loop.

e2e: upload JSONL → batch → validate + shard → one model worker → finalize →
download the output file, through the openai SDK against the API (embedded
default stack: PostgreSQL and Redis from their wheels, a file:// store).
raw: the same model, inputs and batch policy in a tight loop in this process
(tokenize, plan, embed); no I/O.
encode(): what a data team would run instead, sentence-transformers' own
``SentenceTransformer.encode`` on the same texts with its defaults (batches of 32,
sorted by length), in this process, no I/O.
Rounds alternate raw, encode(), e2e.
Workload: bench.workload.texts(N, seed=0, max_sentences=M): with the default M=24 a
long tail of lengths (padding decides who wins), with M=2 short texts of like lengths
(encode()'s best case: the service's own costs decide).
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


def st_encode(model, inputs: list[str]) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    model.encode(inputs, batch_size=32)
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
    ap.add_argument("--max-sentences", type=int, default=24,
                    help="the longest text in sentences (2: short texts of like lengths)")
    args = ap.parse_args()

    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    from cli.stack import Stack
    from jobs.core.settings import Settings
    from workers.engines.batching import BatchPolicy
    from workers.models.embeddings import EmbeddingModel, packaged_path

    work = texts(args.n, seed=0, max_sentences=args.max_sentences)
    items = [t for _, t in work]
    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port())
        path = Path(tmp) / "input.jsonl"
        write_embeddings_jsonl(path, work)
        model = EmbeddingModel(st.embedding_model)
        policy = BatchPolicy(st.max_batch_tokens, st.max_batch_rows)
        raw_loop(model, policy, items[:64])  # warm-up
        st_model = SentenceTransformer(str(packaged_path(st.embedding_model)),
                                       device=str(model.device))
        st_encode(st_model, items[:64])
        with Stack(st) as stack:
            client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key)
            warm = Path(tmp) / "warm.jsonl"
            write_embeddings_jsonl(warm, texts(200, seed=1))
            e2e(client, warm, 200)  # the worker's first batches pay one-off costs
            raw_t, enc_t, e2e_t = [], [], []
            for _ in range(args.rounds):
                raw_t.append(raw_loop(model, policy, items))
                enc_t.append(st_encode(st_model, items))
                e2e_t.append(e2e(client, path, args.n))
    ratios = [r / e for r, e in zip(raw_t, e2e_t, strict=True)]
    vs_encode = [c / e for c, e in zip(enc_t, e2e_t, strict=True)]
    rows = [["raw in-process loop", spread([args.n / t for t in raw_t])],
            ["sentence-transformers encode()", spread([args.n / t for t in enc_t])],
            ["e2e through inferq", spread([args.n / t for t in e2e_t])],
            ["e2e ÷ raw throughput", spread(ratios)],
            ["e2e ÷ encode() throughput", spread(vs_encode)]]
    report("pipeline", f"pipeline efficiency, {args.n} embeddings requests of at most "
           f"{args.max_sentences} sentences, one worker",
           ["side", "texts/s (median [range])"], rows,
           {"n": args.n, "rounds": args.rounds, "max_sentences": args.max_sentences,
            "raw_seconds": raw_t, "e2e_seconds": e2e_t,
            "encode_seconds": enc_t, "ratio": ratios, "vs_encode": vs_encode,
            "shard_rows": st.shard_rows, "chunk_rows": st.chunk_rows})


if __name__ == "__main__":
    main()
