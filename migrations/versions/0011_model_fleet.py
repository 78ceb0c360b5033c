"""Model versions carry their rollout and their warm pool; batches and jobs the version
they are served by.

``models.traffic_weight``: the share (0 to 1) of a name's realtime requests and jobs
sent to this version instead of the default one (a canary). ``models.shadow_share``:
the share of the default version's realtime requests mirrored to this version, whose
answers are compared and never returned. ``models.min_resident``: copies of this
version kept resident on live workers; ``models.idle_unload_s``: how long a copy
beyond those may stay unused before it is unloaded (NULL: never).
``batches.model_version`` and ``jobs.model_version``: the version pinned when the
batch was validated or the job created.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("traffic_weight", sa.Float(), nullable=False,
                                      server_default="0"))
    op.add_column("models", sa.Column("shadow_share", sa.Float(), nullable=False,
                                      server_default="0"))
    op.add_column("models", sa.Column("min_resident", sa.Integer(), nullable=False,
                                      server_default="0"))
    op.add_column("models", sa.Column("idle_unload_s", sa.Integer(), nullable=True))
    op.add_column("batches", sa.Column("model_version", sa.String(length=64), nullable=True))
    op.add_column("jobs", sa.Column("model_version", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "model_version")
    op.drop_column("batches", "model_version")
    for c in ("idle_unload_s", "min_resident", "shadow_share", "traffic_weight"):
        op.drop_column("models", c)
