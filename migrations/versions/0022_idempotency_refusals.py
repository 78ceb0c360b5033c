"""A refused request leaves its Idempotency-Key unused (api/idempotency.py): the
refusals stored before are forgotten, so a request sent again with one of those keys
is run again rather than answered with the stored refusal.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 20:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DELETE FROM idempotency_keys WHERE response_status >= 400")


def downgrade() -> None:
    pass  # nothing to restore: a key with no row is unused under either revision
