"""Fixtures shared by integration modules: a Redis and a PostgreSQL of the module's own
(never the machine's or the session's), each on data that outlives a restart, for the
tests that stop and start backends; and the in-process app of the Uploads API's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.fleet import registry
from jobs.tenants import auth
from storage.embedded import EmbeddedRedis
from tests.conftest import RedisDatabases, free_port, fresh_database
from tests.stacks import Database


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    r = EmbeddedRedis(tmp_path_factory.mktemp("broker"), port=free_port())
    yield r
    r.stop()


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    db = Database(tmp_path_factory.mktemp("database") / "pg")
    yield db
    db.stop()


PART_LIMIT = 64 * 1024  # the uploads world's max_upload_part_bytes
MAX_BYTES = 4 * 1024 * 1024  # and its max_upload_bytes
UPLOADS_MODEL = "uploads-embedder"


@pytest.fixture(scope="module")
def uploads_world(settings: Settings, pg_admin_url: str,
                  redis_dbs: RedisDatabases) -> Iterator[dict[str, Any]]:
    """The app of the Uploads and retention tests, in this process, on a database and
    Redis DB of the module's own: small part and upload limits, two projects' keys, and
    an embeddings model in the registry only (a batch for it can be created; no worker
    runs it)."""
    from api.app import create_app

    with fresh_database(pg_admin_url) as url, redis_dbs.lend() as redis_url:
        st = settings.model_copy(update={"database_url": url, "redis_url": redis_url,
                                         "max_upload_part_bytes": PART_LIMIT,
                                         "max_upload_bytes": MAX_BYTES})
        app = create_app(st)
        ctx: Context = app.extensions["inferq"]
        registry.register(ctx, UPLOADS_MODEL, "1", registry.EMBEDDINGS_KIND, "test", [], 512)
        yield {"app": app, "ctx": ctx, "key": auth.create_tenant(ctx, "uploads-a")[1],
               "other": auth.create_tenant(ctx, "uploads-b")[1]}
        ctx.close()
