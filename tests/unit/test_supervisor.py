"""The supervisor of ``inferq up``: its backoff and give-up decisions on a clock the
test moves, then the same supervisor restarting real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.supervisor import (
    ChildCrashLoop,
    ChildRecord,
    RestartPolicy,
    Supervisor,
    describe_exit,
)
from tests.conftest import process_alive

POLICY = RestartPolicy(first_delay_s=1, max_delay_s=30, stable_s=60, max_exits=5, window_s=60)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [POLICY.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_quick_exits_back_off_and_a_stable_run_starts_over() -> None:
    rec, t, waits = ChildRecord(), 0.0, []
    for _ in range(3):  # each run lasts 10 s, each exit 30 s after the one before
        t += 10
        waits.append(rec.exited(POLICY, t - 10, t))
        t += 20
    assert waits == [1, 2, 4]
    t += 1000
    assert rec.exited(POLICY, t - 100, t) == 1  # it had stayed up 100 s: back to 1 s


def test_exits_within_the_window_give_up_and_old_ones_are_forgotten() -> None:
    rec = ChildRecord()
    assert [rec.exited(POLICY, t - 1, t) for t in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert rec.exited(POLICY, 4, 5) is None  # the fifth exit within 60 s

    rec = ChildRecord()
    decisions = [rec.exited(POLICY, t - 1, t) for t in (1, 25, 50, 75, 100, 125)]
    assert None not in decisions  # never five exits within one minute


def test_exits_are_described_by_signal_name() -> None:
    assert describe_exit(-9) == "SIGKILL, possibly the kernel's OOM killer"
    assert describe_exit(-15) == "SIGTERM"
    assert describe_exit(3) == "exit status 3"


class Children:
    """Real child processes, as ``inferq up`` starts them (each its own session)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.scripts: dict[str, str] = {}
        self.said: list[str] = []
        self.now = 0.0
        self.started: list[subprocess.Popen[bytes]] = []

    def add(self, name: str, script: str) -> None:
        self.scripts[name] = script
        self.procs[name] = self.spawn(name)

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", self.scripts[name]], start_new_session=True)
        self.started.append(p)
        return p

    def log_of(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def supervisor(self, policy: RestartPolicy = POLICY) -> Supervisor:
        return Supervisor(self.procs, self.spawn, self.log_of, self.said.append, policy,
                          clock=lambda: self.now)


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    c = Children(tmp_path)
    yield c
    for p in c.started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


SLEEPER = "import time; time.sleep(120)"


def test_a_killed_child_is_restarted_and_the_others_keep_running(children: Children) -> None:
    children.add("worker-gpu0", SLEEPER)
    children.add("api", SLEEPER)
    sup = children.supervisor()
    victim, api = children.procs["worker-gpu0"], children.procs["api"]
    victim.kill()
    victim.wait()
    sup.poll()
    assert children.procs["worker-gpu0"] is victim  # waiting out its backoff
    assert children.said == [f"worker-gpu0 exited (SIGKILL, possibly the kernel's OOM killer);"
                             f" restarting it in 1 s (log: {children.log_of('worker-gpu0')})"]
    children.now += 1
    sup.poll()
    again = children.procs["worker-gpu0"]
    assert again is not victim and again.poll() is None
    assert children.said[-1] == f"worker-gpu0 restarted (pid {again.pid})"
    assert children.procs["api"] is api and api.poll() is None
    assert sup.restarts == 1


def test_a_child_that_exits_at_start_stops_the_supervisor(children: Children) -> None:
    children.add("worker-control", "import sys; sys.exit(3)")
    sup = children.supervisor(RestartPolicy(first_delay_s=1, max_exits=3, window_s=60))
    for _ in range(2):
        children.procs["worker-control"].wait()
        sup.poll()
        children.now += 10
        sup.poll()
    children.procs["worker-control"].wait()
    with pytest.raises(ChildCrashLoop) as e:
        sup.poll()
    assert str(e.value) == (
        "worker-control keeps exiting soon after it starts (3 times in 60 s, last: exit "
        f"status 3); see {children.log_of('worker-control')}")
    assert sup.restarts == 2


def test_what_a_dead_child_started_is_killed_with_it(children: Children, tmp_path: Path) -> None:
    """A Celery worker's pool child or gunicorn's worker would otherwise hold the
    model's memory or the port while its replacement starts."""
    pidfile = tmp_path / "grandchild.pid"
    children.add("worker-gpu0", (
        "import pathlib, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
        f"pathlib.Path({str(pidfile)!r}).write_text(str(p.pid))\n"
        "time.sleep(120)\n"))
    sup = children.supervisor()
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "the grandchild never started"
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    victim = children.procs["worker-gpu0"]
    victim.kill()
    victim.wait()
    sup.poll()
    deadline = time.monotonic() + 30
    while process_alive(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived its parent"
        time.sleep(0.05)

