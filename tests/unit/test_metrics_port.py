"""A worker's fixed metrics port still held by the process it replaces is taken once it
is free, so the URL ``inferq up`` printed answers again (workers.process.metrics)."""

from __future__ import annotations

import socket
from urllib.request import urlopen

import pytest

from tests.polling import until
from workers.process import metrics


def test_a_fixed_port_in_use_is_taken_once_it_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_served", {})
    monkeypatch.setattr(metrics, "RETRY_S", 0.05)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    assert metrics.serve("127.0.0.1", port) is None and metrics.url() is None
    assert metrics.serve("127.0.0.1", port) is None  # once: no second waiter
    holder.close()
    url = until(metrics.url, timeout=10, what="the port taken once free")
    assert url == f"http://127.0.0.1:{port}/metrics"
    with urlopen(url, timeout=5) as r:
        assert b"# TYPE " in r.read()


def test_a_free_port_is_bound_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_served", {})
    url = metrics.serve("127.0.0.1", 0)
    assert url is not None and url == metrics.url()
