"""Generation shards commit rows as they finish, out of order.

``shards.done_rows``: the positions of the rows the checkpoints committed, as sorted
``[start, end)`` ranges (jobs/batches/done_rows.py); NULL, as for every existing shard,
means the prefix ``[0, rows_done)``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shards", sa.Column("done_rows", JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("shards", "done_rows")
