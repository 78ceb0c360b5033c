"""Alembic environment: the URL comes from the config set by storage.db.alembic_config."""

from alembic import context
from sqlalchemy import engine_from_config, pool

# The tables outside jobs.core.schema join Base's metadata when their modules are imported.
import jobs.core.access_tables  # noqa: F401
import jobs.core.upload_tables  # noqa: F401
import jobs.core.webhook_tables  # noqa: F401
from jobs.core.schema import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
