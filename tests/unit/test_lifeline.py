"""cli.lifeline: the watcher stops what it was told to when the stack's pipe ends
without ``done``, and nothing when it says ``done``; a process that ignores the
first signal is killed after the grace period."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time

from cli.lifeline import Target, parse, watch

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def sleeper(code: str = "import time; time.sleep(60)") -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_lines_are_parsed_and_anything_else_ignored() -> None:
    assert parse(Target(42, signal.SIGINT, True).line()) == Target(42, signal.SIGINT, True)
    assert parse("kill 7 15 0\n") == Target(7, 15, False)
    for junk in ("", "kill", "kill x 15 0", "stop 7 15 0", "kill 7 15"):
        assert parse(junk) is None


def test_done_stops_nothing() -> None:
    p = sleeper()
    try:
        assert watch(io.StringIO(Target(p.pid, signal.SIGTERM, True).line() + "done\n")) == []
        time.sleep(0.2)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_the_end_of_the_pipe_stops_every_target() -> None:
    plain, stubborn = sleeper(), sleeper(IGNORES_TERM)
    time.sleep(0.5)  # the stubborn one has set its handler
    lines = (Target(plain.pid, signal.SIGTERM, True).line()
             + Target(stubborn.pid, signal.SIGTERM, False).line() + "kill 1 9 0\n")
    t0 = time.monotonic()
    targets = watch(io.StringIO(lines), grace_s=1.0)
    assert [t.pid for t in targets] == [plain.pid, stubborn.pid]  # never pid 1
    assert plain.wait(5) == -signal.SIGTERM
    assert stubborn.wait(5) == -signal.SIGKILL  # after the grace period
    assert time.monotonic() - t0 >= 1.0
