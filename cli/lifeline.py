"""What a stack starts dies with it, however the stack's process ends.

A stack (``cli.stack``) starts its children in process groups of their own (the API,
the control worker, the fork server's model workers), a fork server, and embedded
PostgreSQL (a daemon: its parent is init) and Redis. When the stack's process stops
normally it stops them; when it is killed (SIGKILL, the OOM killer, a crash) nothing
in it runs. So the stack also starts this watcher, in a session of its own, and
tells it over a pipe what to stop: one line per process (``kill PID SIGNAL GROUP``).
The stack holds the pipe's only writing end. When the stack says ``done`` (it
stopped its children itself) the watcher exits; when the pipe reaches its end
without ``done``, the stack is gone: the watcher signals what it was told, waits
``GRACE_S`` and kills what is left.

Run as ``python -m cli.lifeline``; it imports nothing of the service.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

GRACE_S = 15.0


@dataclass(frozen=True)
class Target:
    pid: int
    signal: int
    group: bool  # the process group led by ``pid``

    def line(self) -> str:
        return f"kill {self.pid} {self.signal} {int(self.group)}\n"

    def send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            (os.killpg if self.group else os.kill)(self.pid, sig)

    def alive(self) -> bool:
        try:
            (os.killpg if self.group else os.kill)(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return not _zombie(self.pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def parse(line: str) -> Target | None:
    """A ``kill PID SIGNAL GROUP`` line; None for anything else."""
    parts = line.split()
    if len(parts) == 4 and parts[0] == "kill" and all(p.isdigit() for p in parts[1:]):
        return Target(int(parts[1]), int(parts[2]), parts[3] == "1")
    return None


def watch(lines: IO[str], grace_s: float = GRACE_S) -> list[Target]:
    """Read the stack's lines until ``done`` (nothing to do: returns []) or the end of
    the pipe (the stack is gone: stop every target, SIGKILL after ``grace_s``; returns
    the targets)."""
    targets: list[Target] = []
    for line in lines:
        if line.strip() == "done":
            return []
        t = parse(line)
        if t is not None and t.pid > 1:
            targets.append(t)
    for t in targets:
        t.send(t.signal)
    deadline = time.monotonic() + grace_s
    while any(t.alive() for t in targets) and time.monotonic() < deadline:
        time.sleep(0.1)
    for t in targets:
        if t.alive():
            t.send(signal.SIGKILL)
    return targets


class Lifeline:
    """The stack's side: starts the watcher and tells it each process to stop."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "cli.lifeline"],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, start_new_session=True,
                                     cwd=os.path.dirname(os.path.dirname(__file__)))

    def add(self, pid: int, sig: int = signal.SIGTERM, group: bool = False) -> None:
        """Stop ``pid`` (its process group with ``group``) with ``sig`` if the stack
        dies before it says ``done``."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.proc.stdin.write(Target(pid, int(sig), group).line())
            self.proc.stdin.flush()

    def done(self) -> None:
        """The stack stopped its processes itself: the watcher exits."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            self.proc.stdin.write("done\n")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the stack's to handle
    watch(sys.stdin)


if __name__ == "__main__":
    main()
