"""Alembic migrations on PostgreSQL: the session database is at the head, and a clean
upgrade/downgrade/upgrade on a fresh database (one head: tests/unit/test_migrations.py)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

# The tables outside jobs.core.schema join Base's metadata when their modules are imported.
import jobs.core.access_tables  # noqa: F401
import jobs.core.upload_tables  # noqa: F401
import jobs.core.webhook_tables  # noqa: F401
from jobs.core.schema import Base
from storage.db import alembic_config, downgrade, migrate, normalize_url

TABLES = {"models", "tenants", "api_keys", "files", "batches", "shards"}


def test_migrated_session_database_is_at_head(database_url: str) -> None:
    head = ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()
    eng = create_engine(normalize_url(database_url))
    try:
        with eng.connect() as c:
            assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
    finally:
        eng.dispose()


@pytest.fixture
def fresh_db(database_url: str) -> Iterator[str]:
    url = make_url(normalize_url(database_url))
    admin_url = url.set(database="postgres")
    name = f"inferq_migr_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def tables(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return set(inspect(c).get_table_names())
    finally:
        eng.dispose()


def test_upgrade_downgrade_upgrade_roundtrip(fresh_db: str) -> None:
    assert tables(fresh_db) == set()
    migrate(fresh_db)
    after = tables(fresh_db)
    assert TABLES <= after
    assert "alembic_version" in after
    # the migrations create every table the ORM maps, and nothing else
    assert after - {"alembic_version"} == set(Base.metadata.tables)

    downgrade(fresh_db, "base")
    assert tables(fresh_db) <= {"alembic_version"}

    migrate(fresh_db)
    assert tables(fresh_db) == after
    eng = create_engine(fresh_db)
    try:
        with eng.connect() as c:
            diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    finally:
        eng.dispose()
    assert diff == [], "migrations and the schema (jobs/core/schema.py, *_tables.py) disagree"
    head = ScriptDirectory.from_config(alembic_config(fresh_db)).get_current_head()
    eng = create_engine(fresh_db)
    try:
        with eng.connect() as c:
            assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
    finally:
        eng.dispose()


def test_stored_refusals_leave_their_idempotency_keys(fresh_db: str) -> None:
    """0022: the refusals stored under idempotency keys before a refusal left its key
    unused are forgotten (a key sent again runs its request again); successes stay."""
    migrate(fresh_db, "0021")
    eng = create_engine(fresh_db)
    try:
        with eng.begin() as c:
            c.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', 0)"))
            for key, status in (("made", 200), ("refused", 400), ("missing", 404)):
                c.execute(text("INSERT INTO idempotency_keys (tenant_id, key, request_hash, "
                               "status, response_status, response_body, created_at) VALUES "
                               "('t', :k, 'h', 'done', :s, '{}', 0)"), {"k": key, "s": status})
        migrate(fresh_db)
        with eng.connect() as c:
            left = c.execute(text("SELECT key FROM idempotency_keys")).scalars().all()
    finally:
        eng.dispose()
    assert left == ["made"]
