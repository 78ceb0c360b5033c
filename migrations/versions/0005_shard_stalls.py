"""Count a shard's attempts in a row that committed nothing, and its redone work.

``stalls`` is what the attempt cap (INFERQ_MAX_SHARD_ATTEMPTS) now applies to;
``claimed_chunks`` is the checkpoint an attempt started from, so the next claim
can tell whether it moved. ``attempt`` keeps counting every claim.
``rows_started`` / ``rows_computed`` count rows handed to the engine and rows
whose results were produced, by every attempt: beyond ``rows`` they are work that
interruptions made the shard redo.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shards", sa.Column("stalls", sa.Integer(), server_default="0",
                                      nullable=False))
    op.add_column("shards", sa.Column("claimed_chunks", sa.Integer(), server_default="0",
                                      nullable=False))
    op.add_column("shards", sa.Column("rows_started", sa.Integer(), server_default="0",
                                      nullable=False))
    op.add_column("shards", sa.Column("rows_computed", sa.Integer(), server_default="0",
                                      nullable=False))


def downgrade() -> None:
    op.drop_column("shards", "rows_computed")
    op.drop_column("shards", "rows_started")
    op.drop_column("shards", "claimed_chunks")
    op.drop_column("shards", "stalls")
