"""Output dataset prefixes reserved by the batch that writes them.

``output_reservations``: one row per batch created with ``output_dataset``: its prefix
(``uri``, ending in ``/``), held while the batch has not ended, so that no two such
batches write the same prefix or one inside the other (a batch created naming a held
prefix is refused). A row whose batch has ended holds nothing. Existing batches have
none.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "output_reservations",
        sa.Column("batch_id", sa.String(40), sa.ForeignKey("batches.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("tenant_id", sa.String(40),
                  sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
        sa.Column("uri", sa.String(1024), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_output_reservations_uri", "output_reservations", ["uri"])


def downgrade() -> None:
    op.drop_index("ix_output_reservations_uri", table_name="output_reservations")
    op.drop_table("output_reservations")
