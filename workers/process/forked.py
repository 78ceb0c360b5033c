"""Model workers forked from a warm process instead of started from scratch.

A new Python process spends seconds importing torch, transformers and the rest before
it can load a model; on a busy machine, more than a worker's model load itself. A
stack (``cli.stack``) therefore starts one fork server
(:mod:`multiprocessing`'s ``forkserver``) that has imported those libraries once
(``workers.process.warm``), and starts every model worker as a fork of it:
:func:`run_celery` then becomes ``python -m celery …`` with the worker's own
environment, working directory and log. Nothing that reads settings is imported
before the fork, so each worker's settings are its own.

This module is imported by the torch-free launcher; it imports nothing heavy itself.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys

PRELOAD = "workers.process.warm"


def run_celery(argv: list[str], env: dict[str, str], log_path: str, cwd: str) -> None:
    """In the forked child: lead a session of its own (so its process group can be
    signalled as one, as for a child started with ``start_new_session``), send
    output to ``log_path``, take ``env`` as the whole environment, then run the
    command line ``argv`` (``[python, "-m", module, args…]``) in this interpreter."""
    os.setsid()
    _own_resource_tracker()
    out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for p in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if p and p not in sys.path:
            sys.path.insert(0, p)
    if argv[1:2] != ["-m"] or len(argv) < 3:
        raise ValueError(f"not a `python -m module` command line: {argv}")
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


def _own_resource_tracker() -> None:
    """A fork inherits the stack's multiprocessing resource tracker; what the worker
    registers there (a semaphore of a library) and never unlinks because it was
    killed would be reported as leaked when the stack exits. Like a new interpreter,
    the worker starts a tracker of its own if it needs one."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    fd = getattr(tracker, "_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        vars(tracker).update(_fd=None, _pid=None)
