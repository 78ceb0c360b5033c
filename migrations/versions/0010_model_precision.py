"""Model versions record the precision their weights are served in.

``models.precision``: fp32 (every existing version), bf16 or fp16 (GPU workers), int8
(dynamic quantization on CPU workers). A derived version shares the files of the
version it was made from (its ``object_prefix``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 11:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("precision", sa.String(length=8), nullable=False,
                                      server_default="fp32"))


def downgrade() -> None:
    op.drop_column("models", "precision")
