"""``inferq up`` as a user starts it, with the chat model it serves by default: once it
says it is up, its model worker has built the chat engine (its heartbeat lists it), so
the first chat is answered, not timed out; the worker metrics URLs it printed are on
fixed ports (the API's + 1, + 2) and answer again after the model worker is killed and
started again by ``up``, whose first chat is answered too.

A real ``inferq up`` subprocess on the embedded backends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import orjson
import pytest
import redis

from jobs.core.redis_keys import WORKERS
from tests.helpers import clean_env, start_up
from tests.polling import until

pytestmark = pytest.mark.slow

CHAT = "SmolLM2-135M-Instruct"


@dataclass
class Up:
    proc: subprocess.Popen[str]
    data_dir: Path
    port: int
    key: str
    stderr: Path
    metrics: dict[str, str]  # the worker metrics URLs `up` printed, by process
    first_beat: dict[str, Any]  # the model worker's heartbeat when `up` said it was up

    def redis(self) -> redis.Redis:
        state = json.loads((self.data_dir / "stack.json").read_text())
        return redis.Redis.from_url(state["redis_url"])


def model_beats(r: redis.Redis) -> list[dict[str, Any]]:
    keys = list(r.scan_iter(match=WORKERS + "*"))
    beats = [orjson.loads(raw) for raw in (r.mget(keys) if keys else []) if raw]
    return [b for b in beats if "realtime" in b.get("lanes", [])]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    data = tmp_path_factory.mktemp("up-ready")
    env = clean_env(data)  # the defaults: the chat model included
    started = start_up(env, data)
    proc, port = started.proc, started.port
    state = json.loads((data / "stack.json").read_text())
    r = redis.Redis.from_url(state["redis_url"])
    beats = model_beats(r)  # read at once: what "up" meant when it said so
    r.close()
    key = started.banner[0].split(":", 1)[1].strip()
    assert len(beats) == 1, beats
    yield Up(proc, data, port, key, started.stderr, started.metrics, beats[0])
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(90)


def chat(up: Up, text: str) -> Any:
    from openai import OpenAI

    sdk = OpenAI(base_url=f"http://127.0.0.1:{up.port}/v1", api_key=up.key,
                 _strict_response_validation=True, max_retries=0, timeout=120)
    return sdk.chat.completions.create(model=CHAT, max_tokens=4, temperature=0,
                                       messages=[{"role": "user", "content": text}])


def test_the_first_chat_after_up_is_answered(up: Up) -> None:
    # Ready meant built: the worker announced the chat engine with its first heartbeat.
    assert f"{CHAT}@1" in up.first_beat["engines"], up.first_beat["engines"]
    got = chat(up, "Say hi")
    assert got.choices[0].finish_reason in ("stop", "length") and got.usage.completion_tokens


def scrape(url: str) -> float:
    """The metrics process's start time (its ``process_start_time_seconds``)."""
    with urlopen(url, timeout=10) as r:
        text = r.read().decode()
    assert "# TYPE inferq_" in text
    m = re.search(r"^process_start_time_seconds (\S+)$", text, re.M)
    assert m, text[:500]
    return float(m.group(1))


def test_worker_metrics_urls_are_fixed_and_outlive_a_restart(up: Up) -> None:
    workers = {name: url for name, url in up.metrics.items() if name != "api"}
    control = next(u for n, u in workers.items() if n.endswith("(control)"))
    model = next(u for n, u in workers.items() if not n.endswith("(control)"))
    assert control == f"http://127.0.0.1:{up.port + 1}/metrics"
    assert model == f"http://127.0.0.1:{up.port + 2}/metrics"
    started = scrape(model)

    pool_child = int(up.first_beat["name"].rpartition(":")[2])
    with open(f"/proc/{pool_child}/stat") as f:
        celery_main = int(f.read().rsplit(")", 1)[1].split()[1])
    os.kill(celery_main, signal.SIGKILL)  # the model worker `up` started dies
    r = up.redis()
    try:
        beat = until(lambda: [b for b in model_beats(r) if b["name"] != up.first_beat["name"]
                              and f"{CHAT}@1" in b.get("engines", {})],
                     timeout=300, what="the restarted worker's heartbeat")[0]
    finally:
        r.close()
    assert beat["metrics_url"] == model
    until(lambda: _restarted(model, started), timeout=150,
          what="the printed URL answered by the restarted worker")
    assert "restarted (pid" in up.stderr.read_text()
    t0 = time.monotonic()
    got = chat(up, "Say hi again")  # its first chat: the engine was built before it beat
    assert got.choices[0].message.content is not None and time.monotonic() - t0 < 120


def _restarted(url: str, started: float) -> bool:
    try:
        return scrape(url) != started
    except OSError:
        return False
