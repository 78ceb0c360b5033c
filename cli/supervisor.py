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


def describe_exit(returncode: int, oom_kills: int | None = None) -> str:
    """How a child ended, for a person: the signal by name, or the exit status. For a
    SIGKILL, ``oom_kills`` (the kernel's OOM kills while it ran, None if unknown) says
    whether the OOM killer is a plausible sender."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    if -returncode != signal.SIGKILL:
        return name
    if oom_kills:
        return (f"{name}; the kernel's OOM killer killed {oom_kills} process"
                f"{'es' if oom_kills > 1 else ''} meanwhile, possibly this one (see dmesg)")
    if oom_kills == 0:
        return f"{name}, sent by another process (the kernel's OOM killer killed none)"
    return name


def oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (``/proc/vmstat``); None if unknown."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that exited is started again.

    The n-th exit in a row (each after less than ``stable_s`` up) waits
    ``first_delay_s * 2**(n-1)``, at most ``max_delay_s``; a child that stayed up
    ``stable_s``, or that became ready (it served: what ended it came from outside,
    a kill or a lost host resource), starts over at ``first_delay_s`` and is not
    counted. ``max_exits`` exits within ``window_s``, each before the child became
    ready, mean it cannot start (a bad setting, a missing model): give up."""

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

    def exited(self, policy: RestartPolicy, started_at: float, now: float,
               ready: bool = False) -> float | None:
        """Record an exit at ``now`` of the run started at ``started_at`` (``ready``: it
        had become ready): the seconds to wait before starting it again, or None to
        give up."""
        if ready or now - started_at >= policy.stable_s:
            self.quick_exits = 1
            self.exits.clear()  # a healthy run: the exits before it say nothing now
            return policy.delay(1)
        self.quick_exits += 1
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
    ready: bool = False  # this run became ready
    oom_kills: int | None = None  # the kernel's count when this run started


class Supervisor:
    """Restarts the processes in ``procs`` (name -> process, kept up to date) when they
    exit. ``spawn(name)`` starts a child again and returns it; ``log_of(name)`` is
    where its output goes; ``say`` tells the user what happened. Call ``poll``
    every fraction of a second; it raises :class:`ChildCrashLoop` to stop the stack.
    ``ready(name)`` says whether child ``name``'s current run became ready (a child
    that did is not in a crash loop, however often it is killed)."""

    def __init__(self, procs: dict[str, Child],
                 spawn: Callable[[str], Child],
                 log_of: Callable[[str], Path], say: Callable[[str], None],
                 policy: RestartPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ready: Callable[[str], bool] = lambda _name: False) -> None:
        self.procs, self.spawn, self.log_of, self.say = procs, spawn, log_of, say
        self.policy = policy or RestartPolicy()
        self.clock, self.ready = clock, ready
        now, ooms = clock(), oom_kills()
        self.children = {name: _Child(p, now, oom_kills=ooms) for name, p in procs.items()}
        self.restarts = 0

    def poll(self) -> None:
        """Notice children that became ready or exited, and start those whose backoff
        has passed."""
        now = self.clock()
        for name, child in self.children.items():
            if child.proc is not None and not child.ready:
                child.ready = self.ready(name)
            if child.proc is not None and child.proc.poll() is not None:
                self._exited(name, child, now)
            if child.restart_at is not None and now >= child.restart_at:
                self._start(name, child)

    def _exited(self, name: str, child: _Child, now: float) -> None:
        assert child.proc is not None
        kill_group(child.proc.pid)  # what it started (a pool child, gunicorn's workers)
        code = child.proc.poll()
        assert code is not None
        now_ooms, then = oom_kills(), child.oom_kills
        child.last_exit = describe_exit(
            code, None if now_ooms is None or then is None else now_ooms - then)
        child.proc = None
        wait = child.record.exited(self.policy, child.started_at, now, child.ready)
        if wait is None:
            raise ChildCrashLoop(
                f"{name} keeps exiting soon after it starts ({len(child.record.exits)} "
                f"times in {self.policy.window_s:g} s, last: {child.last_exit}); see "
                f"{self.log_of(name)}")
        child.restart_at = now + wait
        self.say(f"{name} exited ({child.last_exit}"
                 f"{', after it became ready' if child.ready else ''}); restarting it in "
                 f"{wait:g} s (log: {self.log_of(name)})")

    def _start(self, name: str, child: _Child) -> None:
        child.restart_at = None
        child.ready, child.oom_kills = False, oom_kills()
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
