"""This process made ready for vLLM's engine.

vLLM is configured for this process before it is imported (``environment``): no usage
reports and no address look-up outside the machine, the worker's logging left as it is
(vLLM logs through it), and, on CPUs, no thread binding
and torch's thread count left as the worker set it (vLLM's CPU worker would pin
threads to cores and drop torch to one thread for its process). Flask's context proxies
are set aside while the engine is built (``context_proxies_set_aside``).

Each engine's core runs in a process of its own (vLLM's multiprocessing engine core):
vLLM keeps process-wide state there (torch.distributed's groups, its parallel state,
the current config), which an engine that fails to build tears down as it cleans up.
Two engines in one process would share it, and one version that vLLM cannot run would
break every other version's engine. A Celery prefork pool child is daemonic, and
multiprocessing refuses to start children from a daemonic process; ``core_process``
lets the engine start its core anyway, and ties that core's life to the thread that
started it (the engine's, which outlives it): the core is killed when that thread ends,
whichever way the worker dies (``PR_SET_PDEATHSIG``), whether vLLM forks it or, as on
CPUs and on a GPU once CUDA is initialised, spawns a new interpreter for it (whose
target is then wrapped to set it first).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util
from typing import Any


def environment(threads: int | None = None) -> None:
    """Settings vLLM reads from the environment, set before it is imported."""
    # the engine core in a process of its own: its process-wide state its own
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    os.environ["VLLM_NO_USAGE_STATS"] = "1"  # no usage reports to an outside address
    os.environ["DO_NOT_TRACK"] = "1"
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # else it asks a public address
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # vLLM's own logging set-up would replace the handlers of the whole process's root
    # logger (Celery's): its records go through the worker's logging instead.
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    if threads is not None:  # the threads of the engine core's model (vLLM's CPU worker
        # keeps them only when this is set; its process reads it when it starts)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


@contextlib.contextmanager
def context_proxies_set_aside() -> Iterator[None]:
    """vLLM's CPU platform rebinds its kernels by reading every global of every loaded
    module (``hasattr(value, "__dict__")``); werkzeug's context proxies (flask's
    ``request``, ``g``, ``current_app``) raise RuntimeError there outside a request. A
    process that has Flask loaded (tests, a worker sharing a process with the API) has
    them set aside while the engine is built."""
    local = sys.modules.get("werkzeug.local")
    proxy = getattr(local, "LocalProxy", None)
    if proxy is None:
        yield
        return
    aside: list[tuple[dict[str, Any], str, Any]] = []
    for module in list(sys.modules.values()):
        ns = getattr(module, "__dict__", None)
        if not isinstance(ns, dict):
            continue
        for k, v in list(ns.items()):
            if type(v) is proxy:
                aside.append((ns, k, v))
                del ns[k]
    try:
        yield
    finally:
        for ns, k, v in aside:
            ns[k] = v


PR_SET_PDEATHSIG = 1
_core_lock = threading.Lock()  # one engine core started at a time (the daemon flag)


def _die_with_parent(_: object) -> None:
    """In a forked engine core: killed when the thread that started it ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _run_dying_with_parent(parent: int, target: Callable[..., Any], *args: Any,
                           **kwargs: Any) -> Any:
    """A spawned engine core's target: killed when the thread that started it ends (a
    parent already gone before this ran: it exits at once)."""
    _die_with_parent(None)
    if os.getppid() != parent:
        os._exit(1)
    return target(*args, **kwargs)


def _spawning_dying_with_parent() -> Callable[[], None]:
    """Until the returned function is called, a process started by multiprocessing's
    spawn method runs its target under ``_run_dying_with_parent``."""
    spawn = multiprocessing.context.SpawnProcess
    original = spawn.__dict__["_Popen"]

    def popen(process_obj: Any) -> Any:
        target = getattr(process_obj, "_target", None)
        if target is not None:
            process_obj._target = functools.partial(_run_dying_with_parent, os.getpid(),
                                                    target)
        return original.__func__(process_obj)

    spawn._Popen = staticmethod(popen)  # type: ignore[method-assign]
    return lambda: setattr(spawn, "_Popen", original)


@contextlib.contextmanager
def core_process() -> Iterator[None]:
    """While an engine is built: its engine core may be started from a daemonic process
    (a Celery prefork pool child), and a forked core dies with the thread that
    started it."""
    with _core_lock:
        me = multiprocessing.current_process()
        daemon = bool(getattr(me, "_config", {}).get("daemon"))
        token = _Token()
        mp_util.register_after_fork(token, _die_with_parent)  # (held while token lives)
        if daemon:
            me._config["daemon"] = False  # type: ignore[attr-defined]
        _own_authkey(me)
        restore = _spawning_dying_with_parent()
        try:
            yield
        finally:
            restore()
            if daemon:
                me._config["daemon"] = True  # type: ignore[attr-defined]
            del token


def _own_authkey(me: Any) -> None:
    """A Celery pool child is billiard's process, its authkey billiard's
    AuthenticationString, which refuses to be pickled outside billiard's own spawning:
    a core that vLLM starts with multiprocessing's spawn method would fail to start
    ("Pickling an AuthenticationString object is disallowed"). The same key, as
    multiprocessing's own."""
    key = getattr(me, "_config", {}).get("authkey")
    own: Any = getattr(mp_process, "AuthenticationString")  # noqa: B009 (not in typeshed)
    if key is not None and not isinstance(key, own):
        me._config["authkey"] = own(bytes(key))


class _Token:
    """What ``core_process``'s after-fork hook is registered on (weakly)."""


def core_processes(llm: Any) -> list[Any]:
    """The processes of an ``LLMEngine``'s core (none when it runs in this process)."""
    client = getattr(llm, "engine_core", None)
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", None) or [])


def watch_core(llm: Any, exited: Callable[[str], None], dead: type[Exception]) -> None:
    """A thread waits on ``llm``'s core processes; when one ends, ``exited(how)`` is
    called and the client's output queue is given ``dead()``, so a step waiting for the
    core's outputs raises instead of waiting for ever."""
    from multiprocessing.connection import wait

    procs = core_processes(llm)
    outputs = getattr(getattr(llm, "engine_core", None), "outputs_queue", None)
    if not procs or outputs is None:
        return

    def watch() -> None:
        wait([p.sentinel for p in procs])
        exited(", ".join(f"pid {p.pid}: status {p.exitcode}" for p in procs))
        outputs.put_nowait(dead())

    threading.Thread(target=watch, name="inferq-vllm-core-watch", daemon=True).start()
