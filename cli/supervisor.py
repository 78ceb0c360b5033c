"""Keeps ``inferq up``'s children running: a child that exits unexpectedly is started
again after a backoff, while the others go on serving.

``RestartPolicy`` is the decision alone (how long to wait, when to give up), a pure
function of the times a child started and exited; ``Supervisor`` applies it to real
processes, polled by ``inferq up`` between its checks for Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class Child(Protocol):
    """What the stack and its supervisor use of a child process: ``subprocess.Popen``,
    or a model worker forked from the fork server (``cli.forked_child.ForkedChild``)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def describe_exit(returncode: int) -> str:
    """How a child ended, for a person: the signal by name (SIGKILL with the usual
    culprit), or the exit status."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    if -returncode == signal.SIGKILL:
        return f"{name}, possibly the kernel's OOM killer"
    return name


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that exited is started again.

    The n-th exit in a row (each after less than ``stable_s`` up) waits
    ``first_delay_s * 2**(n-1)``, at most ``max_delay_s``; a child that stayed up
    ``stable_s`` starts over at ``first_delay_s``. ``max_exits`` exits within
    ``window_s`` mean it cannot start (a bad setting, a missing model): give up."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    stable_s: float = 60.0
    max_exits: int = 5
    window_s: float = 60.0

    def delay(self, quick_exits: int) -> float:
        """The wait before the next start, after ``quick_exits`` exits in a row."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** max(0, quick_exits - 1))


@dataclass
class ChildRecord:
    """One child's history, as the policy sees it."""

    quick_exits: int = 0  # exits in a row, each soon after its start
    exits: deque[float] = field(default_factory=deque)  # when it exited, within the window

    def exited(self, policy: RestartPolicy, started_at: float, now: float) -> float | None:
        """Record an exit at ``now`` of the run started at ``started_at``: the seconds
        to wait before starting it again, or None to give up."""
        self.quick_exits = 1 if now - started_at >= policy.stable_s else self.quick_exits + 1
        self.exits.append(now)
        while self.exits and self.exits[0] < now - policy.window_s:
            self.exits.popleft()
        if len(self.exits) >= policy.max_exits:
            return None
        return policy.delay(self.quick_exits)


class ChildCrashLoop(Exception):
    """A child keeps exiting soon after it starts; the message names it and its log."""


@dataclass
class _Child:
    proc: Child | None
    started_at: float
    record: ChildRecord = field(default_factory=ChildRecord)
    restart_at: float | None = None  # waiting for its backoff to pass
    last_exit: str = ""


class Supervisor:
    """Restarts the processes in ``procs`` (name -> process, kept up to date) when they
    exit. ``spawn(name)`` starts a child again and returns it; ``log_of(name)`` is
    where its output goes; ``say`` tells the user what happened. Call ``poll``
    every fraction of a second; it raises :class:`ChildCrashLoop` to stop the stack."""

    def __init__(self, procs: dict[str, Child],
                 spawn: Callable[[str], Child],
                 log_of: Callable[[str], Path], say: Callable[[str], None],
                 policy: RestartPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.procs, self.spawn, self.log_of, self.say = procs, spawn, log_of, say
        self.policy = policy or RestartPolicy()
        self.clock = clock
        now = clock()
        self.children = {name: _Child(p, now) for name, p in procs.items()}
        self.restarts = 0

    def poll(self) -> None:
        """Notice children that exited, and start those whose backoff has passed."""
        now = self.clock()
        for name, child in self.children.items():
            if child.proc is not None and child.proc.poll() is not None:
                self._exited(name, child, now)
            if child.restart_at is not None and now >= child.restart_at:
                self._start(name, child)

    def _exited(self, name: str, child: _Child, now: float) -> None:
        assert child.proc is not None
        kill_group(child.proc.pid)  # what it started (a pool child, gunicorn's workers)
        code = child.proc.poll()
        assert code is not None
        child.last_exit = describe_exit(code)
        child.proc = None
        wait = child.record.exited(self.policy, child.started_at, now)
        if wait is None:
            raise ChildCrashLoop(
                f"{name} keeps exiting soon after it starts ({len(child.record.exits)} "
                f"times in {self.policy.window_s:g} s, last: {child.last_exit}); see "
                f"{self.log_of(name)}")
        child.restart_at = now + wait
        self.say(f"{name} exited ({child.last_exit}); restarting it in {wait:g} s "
                 f"(log: {self.log_of(name)})")

    def _start(self, name: str, child: _Child) -> None:
        child.restart_at = None
        child.proc = self.spawn(name)
        self.procs[name] = child.proc
        child.started_at = self.clock()
        self.restarts += 1
        self.say(f"{name} restarted (pid {child.proc.pid})")


def kill_group(pgid: int) -> None:
    """SIGKILL whatever is left of a child's process group (each child leads its own)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
