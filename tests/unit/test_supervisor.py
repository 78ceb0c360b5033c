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
from typing import cast

import pytest

from cli.stack import Stack
from cli.supervisor import (
    Child,
    ChildCrashLoop,
    ChildRecord,
    RestartPolicy,
    Supervisor,
    describe_exit,
)
from jobs.core.settings import Settings
from tests.conftest import free_port, process_alive

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
    assert describe_exit(-9) == "SIGKILL"
    assert describe_exit(-15) == "SIGTERM"
    assert describe_exit(3) == "exit status 3"


def test_the_oom_killer_is_named_only_when_it_killed_meanwhile() -> None:
    assert describe_exit(-9, oom_kills=0) == (
        "SIGKILL, sent by another process (the kernel's OOM killer killed none)")
    assert describe_exit(-9, oom_kills=1) == (
        "SIGKILL; the kernel's OOM killer killed 1 process meanwhile, possibly this one "
        "(see dmesg)")
    assert describe_exit(-15, oom_kills=1) == "SIGTERM"


def test_exits_of_a_child_that_became_ready_are_not_a_crash_loop() -> None:
    """Kills from outside (five SIGKILLs 12.5 s apart, each of a run that had become
    ready): restarted each time after the first delay, never given up on."""
    rec, t = ChildRecord(), 0.0
    waits = []
    for _ in range(8):
        t += 12.5
        waits.append(rec.exited(POLICY, t - 12.5, t, ready=True))
    assert waits == [1] * 8
    # Runs that never became ready still count, and still give up.
    assert [rec.exited(POLICY, t + n - 1, t + n) for n in (1, 2, 3, 4)] == [2, 4, 8, 16]
    assert rec.exited(POLICY, t + 4, t + 5) is None


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
        return Supervisor(self.children(), self.spawn, self.log_of, self.said.append,
                          policy, clock=lambda: self.now)

    def children(self) -> dict[str, Child]:
        """``procs`` as the supervisor sees it (it puts the restarted Popens in it)."""
        return cast("dict[str, Child]", self.procs)


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
    [said] = children.said
    assert said.startswith("worker-gpu0 exited (SIGKILL"), said
    assert said.endswith(f"); restarting it in 1 s (log: {children.log_of('worker-gpu0')})")
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


def test_a_child_killed_after_it_became_ready_never_stops_the_supervisor(
        children: Children) -> None:
    children.add("worker-gpu0", SLEEPER)
    ready: set[int] = set()  # pids of the runs that said they are ready
    sup = Supervisor(children.children(), children.spawn, children.log_of, children.said.append,
                     POLICY, clock=lambda: children.now,
                     ready=lambda name: children.procs[name].pid in ready)
    for _ in range(6):  # six kills 12.5 s apart, each of a run that had become ready
        victim = children.procs["worker-gpu0"]
        ready.add(victim.pid)
        sup.poll()
        children.now += 12.5
        victim.kill()
        victim.wait()
        sup.poll()
        assert "after it became ready" in children.said[-1]
        children.now += 1
        sup.poll()
        assert children.procs["worker-gpu0"] is not victim
    assert sup.restarts == 6


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



def test_the_api_is_ready_when_its_health_endpoint_answers(tmp_path: Path) -> None:
    """gunicorn runs at log level warning (its log never says "Listening at"): the API
    child is ready when /healthz answers, not before, and its kills after that are a
    ready run's (no crash loop)."""
    site, go = tmp_path / "site", tmp_path / "go"
    site.mkdir()
    (site / "healthz").write_text('{"status": "ok"}')
    stack = Stack(Settings(data_dir=tmp_path, api_host="127.0.0.1"), port=free_port(),
                  log_dir=tmp_path / "logs")
    serve = ("import pathlib, subprocess, sys, time\n"  # up at once, answering once told
             f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
             "subprocess.run([sys.executable, '-m', 'http.server', sys.argv[1], '--bind', "
             f"'127.0.0.1', '--directory', {str(site)!r}])\n")
    try:
        assert not stack.ready("api")  # nothing listens
        said: list[str] = []
        stack.spawn("api", [sys.executable, "-c", serve, str(stack.port)])
        sup = Supervisor(stack.procs, stack.respawn, stack.log_path, said.append, POLICY,
                         ready=stack.ready)
        for _ in range(3):
            sup.poll()
            time.sleep(0.2)
        assert not stack.ready("api")  # running, not serving yet
        go.touch()
        deadline = time.monotonic() + 60
        while not stack.ready("api"):
            assert time.monotonic() < deadline, "the API never became ready"
            time.sleep(0.1)
        sup.poll()
        victim = stack.procs["api"]
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        sup.poll()
        assert said[-1].startswith("api exited (SIGKILL") and "after it became ready" in said[-1]
    finally:
        stack.stop()
