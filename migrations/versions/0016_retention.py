"""Files expire; a batch says when its output and error files do, and which batch it
reruns.

``batches.output_expires_after``: seconds after their ``created_at`` at which the
batch's output and error files expire (``output_expires_after`` of ``POST
/v1/batches``); NULL for every existing batch (kept until deleted). Indexes of the
files that will expire, of webhook events and idempotency keys by age, and of an
event's deliveries (deleted with it), for the janitor.
``batches.parent_batch_id``: the batch whose failed requests this one reruns (NULL
for every existing batch), indexed for the reruns of a batch.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("output_expires_after", sa.BigInteger(),
                                       nullable=True))
    op.create_index("ix_files_expires_at", "files", ["expires_at"],
                    postgresql_where=sa.text("NOT deleted AND expires_at IS NOT NULL"))
    op.create_index("ix_webhook_events_created_at", "webhook_events", ["created_at"])
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"])
    op.create_index("ix_webhook_deliveries_event_id", "webhook_deliveries", ["event_id"])
    op.add_column("batches", sa.Column("parent_batch_id", sa.String(40), nullable=True))
    op.create_index("ix_batches_parent_batch_id", "batches", ["parent_batch_id"],
                    postgresql_where=sa.text("parent_batch_id IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_batches_parent_batch_id", table_name="batches")
    op.drop_column("batches", "parent_batch_id")
    op.drop_index("ix_webhook_deliveries_event_id", table_name="webhook_deliveries")
    op.drop_index("ix_idempotency_keys_created_at", table_name="idempotency_keys")
    op.drop_index("ix_webhook_events_created_at", table_name="webhook_events")
    op.drop_index("ix_files_expires_at", table_name="files")
    op.drop_column("batches", "output_expires_after")
