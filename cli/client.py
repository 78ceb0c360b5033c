"""Client-side helpers shared by the CLI and the demo (they use the openai SDK)."""

from __future__ import annotations

import time
from typing import Any

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def follow(client: Any, batch_id: str, interval: float = 0.5) -> Any:
    """Poll a batch with a progress bar until it reaches a terminal status."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task(batch_id, total=None)
        while True:
            b = client.batches.retrieve(batch_id)
            rc = b.request_counts
            done = (rc.completed + rc.failed) if rc else 0
            bar.update(task, total=(rc.total or None) if rc else None, completed=done,
                       description=f"{batch_id} {b.status}")
            if b.status in TERMINAL:
                return b
            time.sleep(interval)
