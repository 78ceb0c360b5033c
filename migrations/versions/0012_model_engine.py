"""Model versions name the generation engine they run on.

``models.engine``: auto (every existing version: vLLM where a worker has it and it
serves the architecture, else inferq's transformers engine), transformers or vllm.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("engine", sa.String(length=16), nullable=False,
                                      server_default="auto"))


def downgrade() -> None:
    op.drop_column("models", "engine")
