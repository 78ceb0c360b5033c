"""A model worker that cannot load what it was configured to hold exits at once with
status 78 (EX_CONFIG) and says why, instead of living on without ever serving: no
heartbeat would ever start, the API would count no worker while the process looked
alive, and no orchestrator would restart it. The worker is a real Celery process of
the ``fstack`` (tests/integration/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


def test_a_worker_whose_configured_model_cannot_load_exits_saying_why(
        fstack: Any, workers: Any) -> None:
    proc = workers("unservable", "realtime,batch", INFERQ_CHAT_MODEL="no-such-chat-model",
                   INFERQ_WORKER_HEARTBEAT_S="1")
    assert proc.wait(180) == 78
    log = fstack.log_path("worker-unservable").read_text()
    assert "cannot serve what it was configured for, exiting (status 78)" in log, log[-3000:]
    assert "model 'no-such-chat-model' could not be loaded" in log, log[-3000:]
    assert "inferq models import" in log
