"""``inferq up`` as a process manager: a model worker SIGKILLed mid-batch is started
again while the API and the other worker keep serving, the janitor hands its shard
on as soon as its heartbeat expires, and the batch completes exactly once.

A real ``inferq up --workers 2`` subprocess on the embedded backends, as a user runs it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
import redis
from sqlalchemy import create_engine, text

from jobs.core.redis_keys import WORKERS
from tests.conftest import process_alive
from tests.helpers import clean_env, emb_line, jsonl, lines, start_up, upload, wait

pytestmark = pytest.mark.slow


@dataclass
class Running:
    proc: subprocess.Popen[str]
    data_dir: Path
    port: int
    key: str
    stderr: Path

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.data_dir / "stack.json").read_text())


@pytest.fixture
def up2(tmp_path: Path) -> Iterator[Running]:
    data = tmp_path / "data"
    # Small shards: the batch is spread over both workers; chunks commit often.
    env = clean_env(data, INFERQ_CHAT_MODEL="", INFERQ_SHARD_ROWS="100",
                    INFERQ_CHUNK_ROWS="25", INFERQ_TORCH_THREADS="1")
    up = start_up(env, data, workers=2)
    proc, port, stderr = up.proc, up.port, up.stderr
    key = up.banner[0].split(":", 1)[1].strip()  # "API key:      iq-dev-…"
    yield Running(proc, data, port, key, stderr)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(90)


class Poller(threading.Thread):
    """GET /v1/models every 0.2 s until stopped; every status (or error) it got."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.req = Request(url, headers={"Authorization": f"Bearer {key}"})
        self.answers: list[int | str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            try:
                with urlopen(self.req, timeout=10) as r:
                    self.answers.append(r.status)
            except HTTPError as e:
                self.answers.append(e.code)
            except OSError as e:
                self.answers.append(repr(e))


def parent_of(pid: int) -> int:
    """The parent's pid; -1 once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1
    return int(fields[1])


def heartbeat_pids(r: redis.Redis) -> dict[int, list[str]]:
    """Pid of each process that has a heartbeat -> its lanes."""
    out = {}
    for k in r.scan_iter(match=WORKERS + "*"):
        raw = r.get(k)
        if raw:
            info = json.loads(raw)
            out[int(info["name"].rsplit(":", 1)[1])] = info.get("lanes", [])
    return out


def running_shard_holder(db: Any) -> tuple[str, int] | None:
    with db.connect() as c:
        row = c.execute(text("SELECT id, worker FROM shards WHERE status = 'running' "
                             "AND chunks_done > 0 ORDER BY id LIMIT 1")).first()
    return None if row is None else (row[0], int(row[1].rsplit(":", 1)[1]))


def test_a_sigkilled_worker_is_restarted_and_its_shard_resumed(up2: Running) -> None:
    from openai import OpenAI

    sdk = OpenAI(base_url=f"http://127.0.0.1:{up2.port}/v1", api_key=up2.key,
                 _strict_response_validation=True, max_retries=0, timeout=60)
    state = up2.state
    db = create_engine(state["database_url"])
    r = redis.Redis.from_url(state["redis_url"])
    rows = [emb_line(i, f"row {i}: " + "a sentence of a few words " * (i % 8 + 2))
            for i in range(2000)]  # ~20-30 s on two workers of one thread each
    poller = Poller(f"http://127.0.0.1:{up2.port}/v1/models", up2.key)
    poller.start()
    try:
        b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                               endpoint="/v1/embeddings", completion_window="24h")
        deadline = time.monotonic() + 300
        while (held := running_shard_holder(db)) is None:
            assert time.monotonic() < deadline, "no shard ever committed a chunk"
            assert sdk.batches.retrieve(b.id).status in ("validating", "in_progress")
            time.sleep(0.2)
        shard_id, pool_child = held
        victim = parent_of(pool_child)  # the Celery worker `up` started
        assert parent_of(parent_of(victim)) == up2.proc.pid  # forked by up's fork server
        # its name: the log in which its pool child announced itself ready
        node = next(log.stem.removeprefix("worker-")
                    for log in (up2.data_dir / "logs").glob("worker-*.log")
                    if f":{pool_child} ready: lanes=" in log.read_text(errors="replace"))
        os.kill(victim, signal.SIGKILL)
        assert sdk.batches.retrieve(b.id).status == "in_progress"  # killed mid-batch

        # Back: a new Celery worker under `up`, whose pool child beats again.
        deadline = time.monotonic() + 300
        while True:
            fresh = [pid for pid, lanes in heartbeat_pids(r).items()
                     if "batch" in lanes and pid != pool_child and process_alive(pid)
                     and parent_of(parent_of(parent_of(pid))) == up2.proc.pid
                     and parent_of(pid) != victim]
            if len(fresh) == 2:  # the other worker and the restarted one
                break
            assert time.monotonic() < deadline, up2.stderr.read_text()
            time.sleep(0.5)

        b = wait(sdk, b.id, timeout=900)
    finally:
        poller.stopping.set()
        poller.join()
    assert b.status == "completed", b
    assert b.request_counts is not None
    assert (b.request_counts.completed, b.request_counts.failed) == (len(rows), 0)
    assert b.error_file_id is None
    got = lines(sdk, b.output_file_id)
    assert Counter(x["custom_id"] for x in got) == Counter(x["custom_id"] for x in rows)
    assert poller.answers and set(poller.answers) == {200}, Counter(poller.answers)
    with db.connect() as c:
        attempts = c.execute(text("SELECT attempt FROM shards WHERE id = :id"),
                             {"id": shard_id}).scalar_one()
    assert attempts >= 2  # the killed worker's shard was claimed again

    told = up2.stderr.read_text()
    # A kill from outside of a worker that had become ready: the signal named, the OOM
    # killer only if the kernel counted a kill meanwhile, restarted after the first delay.
    assert re.search(rf"worker-{node} exited \(SIGKILL[,;] .*, after it became ready\); "
                     r"restarting it in 1 s", told), told
    assert f"worker-{node} restarted (pid " in told, told
    assert up2.proc.poll() is None  # the stack kept running
    up2.proc.send_signal(signal.SIGINT)
    assert up2.proc.wait(90) == 0
    db.dispose()
    r.close()

