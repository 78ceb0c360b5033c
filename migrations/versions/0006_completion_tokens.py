"""Count generated tokens apart from prompt tokens, on shards.

``shards.completion_tokens`` is checkpointed with each committed chunk beside
``prompt_tokens`` (which until now held prompt + generated tokens of chat and
completions batches), so a batch's usage, summed over its shards when it is read,
reports input and output tokens as its output lines do. Existing rows start at 0:
the usage of a generation batch that finished before this migration still counts
its generated tokens as input tokens.

``batches.prompt_tokens`` is dropped: a batch's usage is always read from its
shards, so the copy finalize wrote there was never read. A downgrade restores it
from the shards (prompt + generated tokens, as it was counted before).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shards", sa.Column("completion_tokens", sa.BigInteger(), server_default="0",
                                      nullable=False))
    op.drop_column("batches", "prompt_tokens")


def downgrade() -> None:
    op.add_column("batches", sa.Column("prompt_tokens", sa.BigInteger(), server_default="0",
                                       nullable=False))
    op.execute("UPDATE batches SET prompt_tokens = COALESCE((SELECT sum(s.prompt_tokens "
               "+ s.completion_tokens) FROM shards s WHERE s.batch_id = batches.id), 0)")
    op.alter_column("batches", "prompt_tokens", server_default=None)
    op.drop_column("shards", "completion_tokens")
