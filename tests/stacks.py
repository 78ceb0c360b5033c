"""The one way tests start a stack of real processes (API, workers, on real backends),
and the handles they use on one: its Context and an ``openai`` client; and a
PostgreSQL a test can stop and start again on the same data."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.core.context import Context
from jobs.core.settings import Settings
from storage.embedded import EmbeddedPostgres
from tests.conftest import AWS_ENV, free_port

if TYPE_CHECKING:
    from openai import OpenAI

    from cli.stack import Stack


@contextlib.contextmanager
def running_stack(settings: Settings, s3_endpoint: str, log_dir: Path, *,
                  model_workers: int = 1, env: dict[str, str] | None = None,
                  **overrides: Any) -> Iterator[Stack]:
    """A stack on ``settings`` (with ``overrides``), its objects on the S3 server at
    ``s3_endpoint``, its processes' logs in ``log_dir``; stopped when the block ends.
    ``model_workers=0``: the API and the control worker only (a test starts its own)."""
    from cli.stack import Stack

    st = settings.model_copy(update=overrides) if overrides else settings
    stack = Stack(st, port=free_port(), log_dir=log_dir, model_workers=model_workers,
                  extra_env={**AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint, **(env or {})})
    stack.start(api=True, workers=True)
    try:
        yield stack
    finally:
        stack.stop()


@contextlib.contextmanager
def context_of(stack: Stack) -> Iterator[Context]:
    """A Context on the stack's own backends."""
    c = Context(stack.settings)
    try:
        yield c
    finally:
        c.close()


def sdk_of(stack: Stack, key: str | None = None, timeout: float = 120) -> OpenAI:
    """An ``openai`` client of the stack's API, strict, never retrying on its own; with
    the stack's dev key unless another is given."""
    from openai import OpenAI

    return OpenAI(base_url=stack.base_url + "/v1", api_key=key or stack.api_key,
                  _strict_response_validation=True, max_retries=0, timeout=timeout)


class Database:
    """A private PostgreSQL that can be stopped and started on the same data dir."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self.pg = EmbeddedPostgres(pgdata)
        self.url = self.pg.url

    def stop(self) -> None:
        self.pg.stop()

    def start(self) -> None:
        self.pg = EmbeddedPostgres(self.pgdata)
        assert self.pg.url == self.url
