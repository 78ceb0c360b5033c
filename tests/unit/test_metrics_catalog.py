"""Every Prometheus series the processes define is listed in docs/OPERATIONS.md's
Metrics section, and the Grafana dashboard asks only for series that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

import api.metrics
import workers.process.metrics

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\binferq_[a-z0-9_]+")
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def base(name: str) -> str:
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def metrics_section() -> str:
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    return text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]


def defined() -> set[str]:
    """Series the API's and the workers' metrics modules define (plus the scrape-time ones)."""
    names = {base(m._name) for mod in (api.metrics, workers.process.metrics)  # noqa: SLF001
             for m in vars(mod).values() if isinstance(m, MetricWrapperBase)}
    scrape_time = ("inferq_queue_depth", "inferq_breaker_state", "inferq_engine_rows",
                   "inferq_generation_tokens", "inferq_engine_sequences", "inferq_prompt_tokens",
                   "inferq_engine_pending_rows", "inferq_model_resident_bytes",
                   "inferq_model_served", "inferq_accelerator_memory_used_bytes",
                   "inferq_accelerator_memory_total_bytes",
                   "inferq_accelerator_memory_allocated_bytes",
                   "inferq_accelerator_utilization_ratio")
    return names | set(scrape_time)


def test_every_series_is_documented() -> None:
    documented = {base(n) for n in NAME.findall(metrics_section())}
    ours = defined()
    assert "inferq_engine_step_seconds" in ours and "inferq_api_requests" in ours
    missing = ours - documented
    assert not missing, missing


def test_dashboard_asks_for_existing_series() -> None:
    dash = json.loads((ROOT / "docker" / "grafana" / "inferq-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    asked = {base(n) for e in exprs for n in NAME.findall(e)}
    # Series of other modules (admission's) are named in their source.
    source = "".join(p.read_text() for pkg in ("api", "jobs", "workers")
                     for p in (ROOT / pkg).rglob("*.py"))
    unknown = {n for n in asked if n not in defined() and f'"{n}"' not in source}
    assert not unknown, unknown
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
