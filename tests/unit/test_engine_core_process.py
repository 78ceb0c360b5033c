"""An engine core started while ``core_process`` is held dies with the process that
started it, however that process dies (a worker killed with SIGKILL leaves no engine
core behind, holding its memory): whether the core is spawned (vLLM's method on CPUs,
and on a GPU once CUDA is initialised) or forked.

The process that starts the core is a child of this test (a process edge), as vLLM's
engine would start its core; the core here is a sleeping process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

STARTER = """
import multiprocessing, sys, time
from workers.engines.vllm_setup import core_process
with core_process():
    core = multiprocessing.get_context(sys.argv[1]).Process(target=time.sleep, args=(600,))
    core.start()
print(core.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is gone
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_core_dies_with_the_process_that_started_it(method: str) -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, method],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert starter.stdout is not None
        core = int(starter.stdout.readline())
        time.sleep(1)  # (the core's target began: a spawned one sets its signal there)
        assert not gone(core)
        starter.kill()  # the worker alone, as the kernel's OOM killer would
        starter.wait(30)
        deadline = time.monotonic() + 30
        while not gone(core) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(core), f"the core ({method}) outlived the process that started it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(starter.pid, signal.SIGKILL)
