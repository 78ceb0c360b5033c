"""Datasets in place: the object-store locations each project may read and write.

``data_locations``: one row per (project, URI prefix) with its ``access`` (read,
write or read_write), set through the Admin API; a batch over a dataset in place
reads only under a read location of its project and writes only under a write one.
``shards.source``: a shard that is a view of a range of rows of such a dataset (the
file, its row group, the range) instead of an object of its own; NULL for every
existing shard.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "data_locations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(40),
                  sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
        sa.Column("uri", sa.String(1024), nullable=False),
        sa.Column("access", sa.String(16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_data_locations_tenant_id_uri", "data_locations", ["tenant_id", "uri"],
                    unique=True)
    op.add_column("shards", sa.Column("source", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("shards", "source")
    op.drop_index("ix_data_locations_tenant_id_uri", table_name="data_locations")
    op.drop_table("data_locations")
