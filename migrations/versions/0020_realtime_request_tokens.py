"""Realtime request tokens: ``rate_limits.max_tokens_per_realtime_request``, the tokens
one realtime generation of the project may reserve on a model (its sequences times its
max_tokens); NULL takes the deployment's default
(INFERQ_DEFAULT_MAX_TOKENS_PER_REALTIME_REQUEST).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-08 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("rate_limits", sa.Column("max_tokens_per_realtime_request", sa.BigInteger(),
                                           nullable=True))


def downgrade() -> None:
    op.drop_column("rate_limits", "max_tokens_per_realtime_request")
