"""Database engine, sessions and Alembic entry points."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the psycopg 3 driver for them."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def make_engine(url: str, pool_size: int = 5) -> Engine:
    return create_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=10,
        pool_pre_ping=True,
        future=True,
        # JSONB columns: orjson, many times faster than json for the shards' columns
        json_serializer=_json,
        json_deserializer=orjson.loads,
    )


class Database:
    """An engine plus a session factory; one per process."""

    def __init__(self, url: str, pool_size: int = 5) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(url, pool_size)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commits on success, rolls back on error."""
        s = self.sessions()
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read-only session whose statements all see one snapshot of the database
        (REPEATABLE READ): reads of related rows in two statements agree, where under
        the default READ COMMITTED a commit between them would be seen by the second
        only."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ",
                                          postgresql_readonly=True)
            with Session(bind=conn) as s:  # closing ends the transaction, keeps what was read
                yield s

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


class Listener:
    """A connection of its own that LISTENs on a channel: ``wait`` returns when a
    NOTIFY on it arrives (sent at the commit of the transaction that issued it) or
    after ``timeout``. A lost connection is opened again on the next wait; meanwhile
    ``wait`` only sleeps, so a caller that also polls loses nothing but latency."""

    def __init__(self, url: str, channel: str) -> None:
        from sqlalchemy.engine import make_url

        self.conninfo = make_url(normalize_url(url)).set(drivername="postgresql") \
            .render_as_string(hide_password=False)
        self.channel = channel
        self.conn: Any = None

    def wait(self, timeout: float) -> bool:
        """True when a notification arrived."""
        import time

        import psycopg

        try:
            if self.conn is None:
                self.conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
                self.conn.execute(f'LISTEN "{self.channel}"')
            return any(True for _ in self.conn.notifies(timeout=timeout, stop_after=1))
        except psycopg.Error:
            self.close()
            time.sleep(timeout)
            return False

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None
