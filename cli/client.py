"""Client-side helpers shared by the CLI and the demo (they use the openai SDK)."""

from __future__ import annotations

import time
from typing import Any

import click

from cli import state
from jobs.core.settings import Settings
from jobs.core.status import TERMINAL


def api_url(settings: Settings, explicit: str | None = None) -> str:
    """The …/v1 URL: given, else the running ``inferq up`` of the data dir, else
    INFERQ_API_HOST and INFERQ_API_PORT."""
    if explicit:
        return explicit.rstrip("/")
    running = state.read(settings.data_dir)
    if running is not None:
        return running.api_url
    return f"http://{local_host(settings.api_host)}:{settings.api_port}/v1"


# The --api-url option of every command that calls the API.
api_url_option = click.option("--api-url", envvar="INFERQ_API_URL", default=None,
                              help="…/v1 base URL (default: the `inferq up` of the data dir)")


def local_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``."""
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, host)


def connect(settings: Settings, url: str | None, key: str | None) -> Any:
    """An openai client for the API; the key defaults to the dev key of the data dir."""
    from openai import OpenAI

    key = _key(settings, key, "dev-api-key", "API key", "--api-key (INFERQ_API_KEY)")
    return OpenAI(base_url=api_url(settings, url), api_key=key, max_retries=1)


def connect_admin(settings: Settings, url: str | None, key: str | None) -> Any:
    """An openai client for the Admin API; the key defaults to the admin key of the data
    dir (written by ``inferq up``)."""
    from openai import OpenAI

    key = _key(settings, key, "admin-api-key", "admin key", "--admin-key (INFERQ_ADMIN_KEY)")
    return OpenAI(base_url=api_url(settings, url), admin_api_key=key, max_retries=1)


def _key(settings: Settings, key: str | None, filename: str, what: str, option: str) -> str:
    """``key``, or the one `inferq up` wrote to the data dir."""
    path = settings.data_dir / filename
    key = key or (path.read_text().strip() if path.exists() else None)
    if not key:
        raise click.ClickException(
            f"no {what}: pass {option}, or start `inferq up`, which writes one to {path}")
    return key


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


def batch_progress(rate: bool = False, to_stderr: bool = False) -> Any:
    """The progress bar of a batch followed to its end: counts, (its rate,) time spent
    and time left (a rich ``Progress``; rich is imported only when one is shown). Not
    into a terminal, the counts and times without the bar."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=to_stderr)
    # Into a pipe or a file (80 columns), no bar: the rest fits the line whole.
    bar = [BarColumn()] if console.is_terminal else []
    columns = [TextColumn("{task.description}"), *bar, MofNCompleteColumn(),
               *([TextColumn("{task.fields[rate]}")] if rate else []), TimeElapsedColumn(),
               TimeRemainingColumn()]
    return Progress(*columns, console=console)
