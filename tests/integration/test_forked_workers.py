"""A stack's model workers are forked from a fork server that imported torch once
(``workers.process.forked``): each starts with those imports done, its own environment,
working directory, log and process group, and the stack sees it like a Popen."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.forked_child import ForkedChild
from cli.stack import ROOT, Stack
from jobs.core.settings import Settings

PROBE = [sys.executable, "-m", "tests.integration.forked_probe"]


def stack(tmp_path: Path, fork: bool = True) -> Stack:
    return Stack(Settings(data_dir=tmp_path, fork_workers=fork), log_dir=tmp_path / "logs")


def report(st: Stack, name: str) -> dict[str, object]:
    line = st.log_path(name).read_text().splitlines()[0]
    out: dict[str, object] = json.loads(line)
    return out


def test_a_forked_worker_starts_warm_with_its_own_environment_and_group(
        tmp_path: Path) -> None:
    st = stack(tmp_path)
    p = st.spawn("worker-probe", [*PROBE, "once"], True, INFERQ_PROBE="yes")
    assert isinstance(p, ForkedChild)
    assert p.wait(60) == 0 and p.returncode == 0 and p.poll() == 0
    got = report(st, "worker-probe")
    assert got == {"preloaded": True, "cwd": str(ROOT), "probe": "yes", "argv": ["once"],
                   "leads_group": True}
    again = st.respawn("worker-probe")  # as first started: forked, same environment
    assert isinstance(again, ForkedChild) and again.wait(60) == 0


def test_a_killed_forked_worker_reports_its_signal(tmp_path: Path) -> None:
    st = stack(tmp_path)
    p = st.spawn("worker-probe", [*PROBE, "sleep"], True)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.2)
    assert p.poll() is None and p.returncode is None
    os.killpg(p.pid, signal.SIGKILL)  # its group: what it started goes too
    assert p.wait(30) == -signal.SIGKILL


def test_a_killed_worker_whose_child_lives_on_reads_as_exited(tmp_path: Path) -> None:
    """What the worker started (a model's engine core) may outlive it in its group: the
    worker's own death is what the stack sees, so it restarts the worker and kills the
    group."""
    st = stack(tmp_path)
    p = st.spawn("worker-probe", [*PROBE, "orphan"], True)
    log = st.log_path("worker-probe")
    deadline = time.monotonic() + 60
    while len(log.read_text().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    child = json.loads(log.read_text().splitlines()[1])["child"]
    try:
        os.kill(p.pid, signal.SIGKILL)  # the worker alone; its child lives on
        assert p.wait(30) == -signal.SIGKILL
        os.kill(child, 0)  # (still there: the group outlived the worker)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def test_without_the_fork_server_a_worker_is_a_new_interpreter(tmp_path: Path) -> None:
    st = stack(tmp_path, fork=False)
    p = st.spawn("worker-probe", [*PROBE, "once"], True, INFERQ_PROBE="no")
    assert isinstance(p, subprocess.Popen) and p.wait(60) == 0
    got = report(st, "worker-probe")
    assert got["preloaded"] is False and got["probe"] == "no" and got["leads_group"]


def test_a_simulated_accelerator_worker_is_not_forked(tmp_path: Path) -> None:
    st = stack(tmp_path)  # the fork server preloads torch, which it runs without
    p = st.spawn("worker-probe", [*PROBE, "once"], True, INFERQ_ACCELERATOR="simulated")
    assert isinstance(p, subprocess.Popen) and p.wait(60) == 0
    assert report(st, "worker-probe")["preloaded"] is False
