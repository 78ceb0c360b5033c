"""Record which attempt committed each chunk of a shard.

Output parts are now keyed by the attempt that wrote them
(``parts/<shard>/<chunk>.a<attempt>.<kind>.jsonl``), so a worker whose lease lapsed
and that writes its chunk late leaves an orphan instead of overwriting the part
another attempt committed. ``part_attempts`` ({chunk index: attempt}) is set by the
same fenced checkpoint that commits the chunk, and finalize reads exactly those
parts. Existing rows start empty: their committed chunks are read from the key
layout they were written under, ``parts/<shard>/<chunk>.<kind>.jsonl``.

Downgrading drops the record; parts written under attempt keys are then no longer
read, so downgrade only with no batch in progress.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-14 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shards", sa.Column("part_attempts", postgresql.JSONB(), server_default="{}",
                                      nullable=False))


def downgrade() -> None:
    op.drop_column("shards", "part_attempts")
