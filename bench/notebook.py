"""The notebook client (``inferq.client``) on frames of N rows vs the same batch by hand.

Against an embedded stack (PostgreSQL and Redis from their wheels, a file:// store, one
model worker), the same N texts (bench.workload, seed 0) embedded three ways per round,
in alternating order:
- sdk: the rows written as a Parquet batch input by hand, uploaded, a batch created and
  polled through the openai SDK, the output file downloaded and read (what a data team
  writes without the client);
- pandas: ``iq.embed`` on a pandas DataFrame (its result joined back to the rows);
- polars: the same on a polars DataFrame.
Each path embeds texts of its own (the same rows would be answered by an earlier path's
batch: the client's Idempotency-Key is their digest). Each is checked: every row has a
384-value embedding, and every 500th row's is its text's realtime embedding.
Reported: seconds and rows/s of each, the client÷by-hand ratio of each, and how much
this process's peak resident memory (ru_maxrss) grew over the run: the client's
frames and results, and the by-hand path's.
"""

from __future__ import annotations

import argparse
import io
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import free_port, report, spread
from bench.workload import texts


def by_hand(client: Any, items: list[str]) -> tuple[float, list[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    buf = io.BytesIO()
    pq.write_table(pa.table({"custom_id": [str(i) for i in range(len(items))],
                             "input": items}), buf)
    f = client.files.create(file=("rows.parquet", buf.getvalue()), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                              completion_window="24h",
                              extra_body={"body": {"model": "all-MiniLM-L6-v2"}})
    while b.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.25)
        b = client.batches.retrieve(b.id)
    assert b.status == "completed", b
    out = pq.read_table(io.BytesIO(client.files.content(b.output_file_id).content))
    rows = dict(zip(out.column("custom_id").to_pylist(), out.column("embedding").to_pylist(),
                    strict=True))
    dt = time.perf_counter() - t0
    return dt, [rows[str(i)] for i in range(len(items))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    import pandas as pd
    import polars as pl

    from cli.stack import Stack
    from inferq import client as iq
    from jobs.core.settings import Settings

    items = [t for _, t in texts(args.n, seed=0, max_sentences=4)]
    times: dict[str, list[float]] = {"sdk": [], "pandas": [], "polars": []}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Settings(data_dir=Path(tmp), api_port=free_port(), chat_model=""))
        try:
            stack.start()
            api = iq.connect(stack.base_url + "/v1", stack.api_key)
            for r in range(args.rounds):
                # Each round's texts differ (a suffix), so no batch is answered from an
                # earlier one's Idempotency-Key.
                round_items = [f"{t} ({r})" for t in items]
                # Each path its own texts: the same rows would be answered by the batch
                # an earlier path made (the client's Idempotency-Key is their digest).
                path_items = {how: [f"{t} ({r}{how})" for t in items]
                              for how in ("pandas", "polars")}
                order = ["sdk", "pandas", "polars"] if r % 2 == 0 else ["polars", "pandas", "sdk"]
                want: list[Any] = []
                got: dict[str, list[Any]] = {}
                for how in order:
                    t0 = time.perf_counter()
                    if how == "sdk":
                        dt, want = by_hand(api, round_items)
                    else:
                        frame = (pd.DataFrame({"text": path_items[how]}) if how == "pandas"
                                 else pl.DataFrame({"text": path_items[how]}))
                        out = iq.embed(frame, column="text", model="all-MiniLM-L6-v2",
                                       client=api, progress=False, poll_s=0.25)
                        dt = time.perf_counter() - t0
                        got[how] = list(out["embedding"])
                    times[how].append(dt)
                assert len(want) == args.n
                for how, vecs in got.items():
                    assert len(vecs) == args.n and all(len(v) == 384 for v in vecs), how
                    for i in range(0, args.n, args.n // 20):  # row i is row i's text's
                        one = api.embeddings.create(model="all-MiniLM-L6-v2",
                                                    input=path_items[how][i],
                                                    encoding_format="float")
                        assert np.allclose(vecs[i], one.data[0].embedding, atol=1e-4), how
        finally:
            stack.stop()
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    best = {k: min(v) for k, v in times.items()}
    rows = [[how, f"{best[how]:.1f}", spread(times[how]), f"{args.n / best[how]:.0f}",
             "1.00" if how == "sdk" else f"{best['sdk'] / best[how]:.2f}"]
            for how in ("sdk", "pandas", "polars")]
    report("notebook", f"inferq.client on {args.n} rows vs the same batch by hand "
           f"(best of {args.rounds}); this process's peak RSS grew {grown_mb:.0f} MB",
           ["path", "best s", "all s", "rows/s", "rows/s ÷ by hand"], rows,
           {"n": args.n, "rounds": args.rounds, "seconds": times, "rss_growth_mb": grown_mb})


if __name__ == "__main__":
    main()
