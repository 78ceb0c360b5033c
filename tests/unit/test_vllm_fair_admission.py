"""Realtime rows shared among projects on the vLLM engine (workers.engines.vllm, on the
real SmolLM2-135M-Instruct in this process as a worker runs it): vLLM frees no row for
another request, so the last rows (past ``scheduling.ceiling``) are kept for a project
holding none; batch work holding some of the others changes nothing to that."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from jobs.core.settings import default_cache_dir
from jobs.protocol.endpoints import CHAT
from workers.engines.request import build_request
from workers.engines.sinks import Collect
from workers.engines.vllm import VllmEngine
from workers.models.chat import ChatTokens

SMOL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def vllm():  # type: ignore[no-untyped-def]
    from workers.models.importers import converted_dir, smollm2_gguf

    path = converted_dir(default_cache_dir(), SMOL, "1", smollm2_gguf())
    e = VllmEngine(ChatTokens(SMOL, path), path, max_batch_rows=4, max_rows=8,
                   kv_cache_bytes=512 << 20)
    yield e
    e.stop()


def submit(engine: VllmEngine, content: str, prio: int, project: str = "",
           **kw: object) -> Collect:
    c = Collect()
    req = build_request(engine.model, CHAT, {
        "model": SMOL, "messages": [{"role": "user", "content": content}], **kw})
    req.project = project
    engine.submit(req, c, prio)
    return c


def wait_for(engine: VllmEngine, ok: Callable[[tuple[int, int]], bool]) -> None:
    deadline = time.monotonic() + 120
    while not ok(engine.load()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ok(engine.load()), engine.load()


def test_a_project_holding_its_most_rows_leaves_one_to_another(vllm) -> None:  # type: ignore[no-untyped-def]
    """Batch work holds its 4 rows; project A's request of 8 choices takes 3 more and
    stops there (7 of 8: the last row is kept); project B's short request takes that
    row at once and is answered while the batch work and A's choices run."""
    batch = [submit(vllm, f"Tell a long story about the number {i}.", 2, max_tokens=120,
                    temperature=0) for i in range(4)]
    wait_for(vllm, lambda load: load == (4, 0))
    a = submit(vllm, "Write a very long story about the sea.", 0, "A", n=8,
               max_tokens=120, temperature=1.0, seed=1)
    wait_for(vllm, lambda load: load[0] == 7)  # 4 batch rows + 3 of A's
    time.sleep(0.5)
    assert vllm.load()[0] == 7 and vllm.load()[1] >= 4  # the last row stays free
    b = submit(vllm, "Say hi", 0, "B", max_tokens=3, temperature=0)
    b.result(300)  # (a few engine steps; generous for a loaded machine)
    assert not a.event.is_set() and not any(c.event.is_set() for c in batch)
    assert b.usage.completion_tokens == 3
    for c in [a, *batch]:  # they leave at the next step
        c.cancel()
    wait_for(vllm, lambda load: load == (0, 0))
