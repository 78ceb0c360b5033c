"""Webhooks: endpoints, the event outbox, deliveries and their attempts.

``webhook_endpoints`` are a project's endpoints (OpenAI's webhook endpoints API).
``webhook_callback_secrets`` holds a project's secret for per-request callbacks
(``callback_url`` on a job, and on a batch: ``batches.callback_url``).
``webhook_events`` is the outbox, written in the transaction of the status change
that causes an event; ``webhook_deliveries`` is one event to one target, and
``webhook_attempts`` the log of its attempts.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("callback_url", sa.String(length=2048), nullable=True))
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("event_types", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("old_secret", sa.String(length=128), nullable=True),
        sa.Column("old_secret_expires_at", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_endpoints_tenant_id_id", "webhook_endpoints",
                    ["tenant_id", "id"])
    op.create_table(
        "webhook_callback_secrets",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("old_secret", sa.String(length=128), nullable=True),
        sa.Column("old_secret_expires_at", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id"),
    )
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("subject_id", sa.String(length=48), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("give_up_at", sa.Float(), nullable=False),
        sa.Column("lease_token", sa.String(length=32), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["event_id"], ["webhook_events.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["endpoint_id"], ["webhook_endpoints.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["next_attempt_at"],
                    postgresql_where=sa.text("status = 'pending'"))
    op.create_index("ix_webhook_deliveries_endpoint_id_id", "webhook_deliveries",
                    ["endpoint_id", "id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts",
                    ["delivery_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_webhook_attempts_delivery_id", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_endpoint_id_id", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_events")
    op.drop_table("webhook_callback_secrets")
    op.drop_index("ix_webhook_endpoints_tenant_id_id", table_name="webhook_endpoints")
    op.drop_table("webhook_endpoints")
    op.drop_column("batches", "callback_url")
