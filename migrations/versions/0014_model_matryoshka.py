"""Embedding model versions say whether their vectors may be shortened.

``models.matryoshka``: true for an embeddings model trained so that the first values
of its vectors are an embedding of their own (a Matryoshka loss); only such a model
serves ``dimensions``. False for every existing version.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-12 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("matryoshka", sa.Boolean(), nullable=False,
                                      server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("models", "matryoshka")
