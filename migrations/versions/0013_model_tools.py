"""Model versions say whether their chat template renders tools.

``models.tools``: true when the version's chat template refers to ``tools`` (read from
its files when it is published), false when it does not, null where it is not known
(every existing version): the worker that renders the template decides.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-11 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("tools", sa.Boolean(), nullable=True))


def downgrade() -> None:
    op.drop_column("models", "tools")
