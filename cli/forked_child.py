"""Model workers forked from a fork server that has imported torch and the other heavy
libraries once (``workers.process.forked``), as a stack starts them instead of new
interpreters."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import subprocess
import time


class ForkedChild:
    """A model worker forked from the stack's fork server (``workers.process.forked``), with
    the part of ``subprocess.Popen``'s interface that the stack and its supervisor use.
    Like a child started with ``start_new_session``, it leads its own process group."""

    def __init__(self, proc: multiprocessing.process.BaseProcess, args: list[str]) -> None:
        self._proc, self.args = proc, args
        deadline = time.monotonic() + 5  # its group exists once it has called setsid
        while proc.exitcode is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(self.pid) == self.pid:
                    break
            time.sleep(0.005)

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        code = self._proc.exitcode
        # The fork server reports (and reaps) its children's exits; were it gone, every
        # child would read as exited: a child whose process still exists has not. (Its
        # group may outlive it: what it started, until the stack kills the group.)
        return None if code is not None and self._alive() else code

    def _alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._proc.join(timeout)
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.05)
        return code


def fork_server() -> multiprocessing.context.ForkServerContext:
    """The fork server model workers are forked from; started by the first fork, with
    torch and the other heavy libraries imported once (``workers.process.warm``)."""
    from workers.process import forked

    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, multiprocessing.context.ForkServerContext)
    ctx.set_forkserver_preload([forked.PRELOAD])
    return ctx
