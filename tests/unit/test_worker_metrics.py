"""The worker's metric helpers: engine callbacks, stream timings, and accelerator series
that exist only where torch sees a CUDA device."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from prometheus_client import REGISTRY

from workers.process import metrics


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_batch_recorder_counts_rows_tokens_and_padding() -> None:
    before = (value("inferq_engine_step_rows_sum", engine="embeddings", model="m-unit"),
              value("inferq_engine_padding_efficiency_count", model="m-unit"))
    record = metrics.batch_recorder("m-unit")
    record(4, 30, 40, 0.01)
    record(2, 10, 10, 0.02)
    assert value("inferq_engine_step_rows_sum", engine="embeddings",
                 model="m-unit") - before[0] == 6
    assert value("inferq_engine_padding_efficiency_count", model="m-unit") - before[1] == 2
    assert value("inferq_engine_padding_efficiency_sum", model="m-unit") == pytest.approx(1.75)
    assert value("inferq_engine_real_tokens_total", model="m-unit") == 40
    assert value("inferq_engine_computed_tokens_total", model="m-unit") == 50
    assert value("inferq_engine_step_tokens_sum", model="m-unit") == 50


def test_stream_timer_first_token_then_gaps() -> None:
    now = [100.0]
    t = metrics.StreamTimer("realtime", "m-stream", enqueued_at=99.5, clock=lambda: now[0])
    for step in (0.0, 0.1, 0.3):
        now[0] += step
        t.delta()
    assert value("inferq_time_to_first_token_seconds_count", lane="realtime",
                 model="m-stream") == 1
    assert value("inferq_time_to_first_token_seconds_sum", lane="realtime",
                 model="m-stream") == pytest.approx(0.5)
    assert value("inferq_inter_token_seconds_count", lane="realtime", model="m-stream") == 2
    assert value("inferq_inter_token_seconds_sum", lane="realtime",
                 model="m-stream") == pytest.approx(0.4)


def test_no_accelerator_series_without_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert list(metrics.accelerator_metrics()) == []


def test_accelerator_series_from_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's CUDA calls are the hardware edge: a stand-in for a two-device machine."""
    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 2,
        mem_get_info=lambda i: (30 - i, 80), memory_allocated=lambda i: 7 + i)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: no utilization
    got: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for fam in metrics.accelerator_metrics():
        got[fam.name] = [(s.labels, s.value) for s in fam.samples]
    assert got == {
        "inferq_accelerator_memory_used_bytes": [({"device": "0"}, 50), ({"device": "1"}, 51)],
        "inferq_accelerator_memory_total_bytes": [({"device": "0"}, 80), ({"device": "1"}, 80)],
        "inferq_accelerator_memory_allocated_bytes": [({"device": "0"}, 7),
                                                      ({"device": "1"}, 8)],
    }


def test_serve_picks_a_free_port_once() -> None:
    from urllib.request import urlopen

    url = metrics.serve("127.0.0.1", 0)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert metrics.serve("127.0.0.1", 0) == url == metrics.url()
    with urlopen(url, timeout=5) as r:
        assert b"inferq_engine_step_seconds" in r.read()
