"""This process made ready for vLLM's engine.

vLLM is configured for this process before it is imported (``environment``): no usage
reports and no address look-up outside the machine, the worker's logging left as it is
(vLLM logs through it), and, on CPUs, no thread binding
and torch's thread count left as the worker set it (vLLM's CPU worker would pin
threads to cores and drop torch to one thread for the whole process, where the
embedding engine also runs). Flask's context proxies are set aside while the engine is
built (``context_proxies_set_aside``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


def environment(threads: int | None = None) -> None:
    """Settings vLLM reads from the environment, set before it is imported."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    os.environ["VLLM_NO_USAGE_STATS"] = "1"  # no usage reports to an outside address
    os.environ["DO_NOT_TRACK"] = "1"
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # else it asks a public address
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # vLLM's own logging set-up would replace the handlers of the whole process's root
    # logger (Celery's): its records go through the worker's logging instead.
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    if threads is not None:  # vLLM's CPU worker keeps torch's threads only when this is set
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
