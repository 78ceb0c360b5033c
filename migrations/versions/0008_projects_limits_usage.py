"""Projects, service accounts, admin keys, rate limits, usage records, fair dispatch.

Tenants are the Admin API's projects: ``archived_at`` (an archived project's keys no
longer authenticate) and ``weight`` (its share of the batch lanes). API keys get a
name, an owning service account, a suffix for their redacted value, ``last_used_at``
and ``expires_at``. ``admin_api_keys`` holds the keys of the Admin API.
``rate_limits`` holds a project's limits per model. ``usage_records`` is billable
work, one row per counted unit (``source`` unique, so nothing is counted twice).
Batches and jobs record the key that created them; a batch records an upper bound
of its input tokens (``input_tokens``, for the daily batch token limit).
``shards.dispatched_at`` is set when the fair dispatcher sends a shard to its broker
queue; existing shards were sent at validation, so they start dispatched.
``dispatch_deficits`` holds each batch lane's deficit round robin across projects.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("archived_at", sa.BigInteger(), nullable=True))
    op.add_column("tenants", sa.Column("weight", sa.Integer(), server_default="1",
                                       nullable=False))
    op.create_table(
        "service_accounts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_service_accounts_tenant_id_id", "service_accounts", ["tenant_id", "id"])
    op.add_column("api_keys", sa.Column("suffix", sa.String(length=8), server_default="",
                                        nullable=False))
    op.add_column("api_keys", sa.Column("name", sa.String(length=200), server_default="",
                                        nullable=False))
    op.add_column("api_keys", sa.Column("service_account_id", sa.String(length=40),
                                        nullable=True))
    op.create_foreign_key("api_keys_service_account_id_fkey", "api_keys", "service_accounts",
                          ["service_account_id"], ["id"], ondelete="CASCADE")
    op.add_column("api_keys", sa.Column("last_used_at", sa.BigInteger(), nullable=True))
    op.add_column("api_keys", sa.Column("expires_at", sa.BigInteger(), nullable=True))
    op.create_index("ix_api_keys_tenant_id_id", "api_keys", ["tenant_id", "id"])
    op.create_table(
        "admin_api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("suffix", sa.String(length=8), server_default="", nullable=False),
        sa.Column("name", sa.String(length=200), server_default="", nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    op.create_table(
        "rate_limits",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("max_requests_per_1_minute", sa.BigInteger(), nullable=True),
        sa.Column("max_tokens_per_1_minute", sa.BigInteger(), nullable=True),
        sa.Column("max_requests_per_1_day", sa.BigInteger(), nullable=True),
        sa.Column("batch_1_day_max_input_tokens", sa.BigInteger(), nullable=True),
        sa.Column("max_concurrent_streams", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "model"),
    )
    op.create_table(
        "usage_records",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("lane", sa.String(length=16), nullable=False),
        sa.Column("service_tier", sa.String(length=16), nullable=False),
        sa.Column("batch_id", sa.String(length=40), nullable=True),
        sa.Column("num_requests", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accelerator_seconds", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("source"),
    )
    op.create_index("ix_usage_records_created_at", "usage_records", ["created_at"])
    op.create_index("ix_usage_records_tenant_id_created_at", "usage_records",
                    ["tenant_id", "created_at"])
    op.add_column("batches", sa.Column("api_key_id", sa.String(length=40), nullable=True))
    op.add_column("batches", sa.Column("input_tokens", sa.BigInteger(), server_default="0",
                                       nullable=False))
    op.add_column("jobs", sa.Column("api_key_id", sa.String(length=40), nullable=True))
    op.add_column("shards", sa.Column("dispatched_at", sa.Float(), nullable=True))
    op.execute("UPDATE shards SET dispatched_at = updated_at")
    op.add_column("shards", sa.Column("created_at", sa.Float(), nullable=True))
    op.add_column("shards", sa.Column("claimed_at", sa.Float(), nullable=True))
    op.create_index("ix_shards_waiting", "shards", ["batch_id", "index"],
                    postgresql_where=sa.text("dispatched_at IS NULL AND status = 'queued'"))
    op.create_table(
        "dispatch_deficits",
        sa.Column("lane", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("deficit", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("lane", "tenant_id"),
    )


def downgrade() -> None:
    op.drop_table("dispatch_deficits")
    op.drop_index("ix_shards_waiting", table_name="shards")
    op.drop_column("shards", "claimed_at")
    op.drop_column("shards", "created_at")
    op.drop_column("shards", "dispatched_at")
    op.drop_column("jobs", "api_key_id")
    op.drop_column("batches", "input_tokens")
    op.drop_column("batches", "api_key_id")
    op.drop_index("ix_usage_records_tenant_id_created_at", table_name="usage_records")
    op.drop_index("ix_usage_records_created_at", table_name="usage_records")
    op.drop_table("usage_records")
    op.drop_table("rate_limits")
    op.drop_table("admin_api_keys")
    op.drop_index("ix_api_keys_tenant_id_id", table_name="api_keys")
    for col in ("expires_at", "last_used_at"):
        op.drop_column("api_keys", col)
    op.drop_constraint("api_keys_service_account_id_fkey", "api_keys", type_="foreignkey")
    for col in ("service_account_id", "name", "suffix"):
        op.drop_column("api_keys", col)
    op.drop_index("ix_service_accounts_tenant_id_id", table_name="service_accounts")
    op.drop_table("service_accounts")
    op.drop_column("tenants", "weight")
    op.drop_column("tenants", "archived_at")
