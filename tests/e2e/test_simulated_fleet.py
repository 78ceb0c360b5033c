"""A fleet of workers on the simulated accelerator (INFERQ_ACCELERATOR=simulated) against
real processes (``fstack``: API, control worker, a database of its own): a batch runs
end to end on three of them with every custom_id exactly once; the realtime and jobs
lanes answer; the heartbeats say "simulated"; no pool process has torch loaded."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest
import redis as redis_lib

from jobs.core.redis_keys import WORKERS
from tests.helpers import emb_line, jsonl, lines, upload, wait

pytestmark = pytest.mark.slow
SIM = {"INFERQ_ACCELERATOR": "simulated", "INFERQ_SIMULATED_PROFILE": "h100-minilm"}


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def beats_of(fstack: Any, procs: list[Any], timeout: float = 120) -> list[dict[str, Any]]:
    """The heartbeats of the pool children of the worker processes ``procs``."""
    mine = {p.pid for p in procs}
    r = redis_lib.Redis.from_url(fstack.settings.redis_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            found = []
            for key in r.scan_iter(match=WORKERS + "*"):
                info = json.loads(r.get(key) or "{}")
                host, _, pid = info.get("name", "").rpartition(":")
                if host == socket.gethostname() and pid.isdigit():
                    try:
                        if parent_pid(int(pid)) in mine:
                            found.append(info)
                    except (OSError, IndexError, ValueError):
                        continue  # a process that has ended
            if len(found) == len(mine) or time.monotonic() > deadline:
                return found
            time.sleep(0.5)
    finally:
        r.close()


def test_a_batch_runs_once_on_a_simulated_fleet(fstack: Any, fsdk: Any, workers: Any) -> None:
    procs = [workers("sim1", "realtime,jobs,batch", **SIM), workers("sim2", "batch", **SIM),
             workers("sim3", "batch", **SIM)]
    beats = beats_of(fstack, procs)
    assert len(beats) == 3, beats
    for b in beats:
        assert b["accelerator"] == "simulated" and b["simulated_profile"] == "h100-minilm"
        assert b["models"] == ["all-MiniLM-L6-v2"]  # embeddings only: no chat model
        pid = int(b["name"].rpartition(":")[2])
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libtorch" not in maps, f"{b['name']} has torch loaded"

    n = 1200  # 3 shards of fstack's 400 rows
    rows = [emb_line(i, f"simulated sentence {i % 50} " * (1 + i % 5)) for i in range(n)]
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    b = wait(fsdk, b.id, timeout=300)
    assert b.status == "completed", b
    out, err = lines(fsdk, b.output_file_id), lines(fsdk, b.error_file_id)
    assert err == []
    seen = Counter(x["custom_id"] for x in out)
    assert set(seen) == {f"req-{i}" for i in range(n)} and set(seen.values()) == {1}
    vec = {x["custom_id"]: x["response"]["body"]["data"][0]["embedding"] for x in out}
    assert len(vec["req-0"]) == 384
    # The same input has the same vector on whichever worker ran it.
    assert vec["req-0"] == vec["req-250"] and vec["req-0"] != vec["req-1"]
    assert np.linalg.norm(vec["req-7"]) == pytest.approx(1.0, abs=1e-5)
    deadline = time.monotonic() + 30  # the engines' counters, as the next beats say
    while (rows_run := sum(s["stats"]["embeddings"]["rows"] for s in beats_of(fstack, procs))
           ) < n and time.monotonic() < deadline:
        time.sleep(1)
    assert rows_run >= n

    # The realtime and jobs lanes of sim1 answer with the same vectors.
    e = fsdk.embeddings.create(model="all-MiniLM-L6-v2", input=rows[0]["body"]["input"],
                              encoding_format="float")
    assert e.data[0].embedding == pytest.approx(vec["req-0"], abs=1e-6)
    with httpx2.Client(base_url=fstack.base_url, timeout=60,
                       headers={"Authorization": f"Bearer {fstack.api_key}"}) as api:
        r = api.post("/v1/jobs", json={"endpoint": "/v1/embeddings", "body": rows[1]["body"]})
        assert r.status_code in (200, 201, 202), r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 60
        while (job := api.get(f"/v1/jobs/{job_id}").json())["status"] not in (
                "completed", "failed") and time.monotonic() < deadline:
            time.sleep(0.3)
    assert job["status"] == "completed", job
    assert job["result"]["data"][0]["embedding"] == pytest.approx(vec["req-1"], abs=1e-6)
