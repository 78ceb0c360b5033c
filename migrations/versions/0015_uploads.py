"""Uploads: a file sent in parts (the OpenAI Uploads API).

``uploads``: one row per upload (its declared size, name, purpose and MIME type, its
status, and once completed the File it made, the parts' order and the md5 verified);
``upload_parts``: one row per part received (its size and first bytes), each an object
of its own in the store until the upload is completed, cancelled or expired.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-19 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "uploads",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("filename", sa.String(length=512), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("mime_type", sa.String(length=128), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("file_expires_after", sa.BigInteger(), nullable=True),
        sa.Column("file_id", sa.String(length=40), nullable=True),
        sa.Column("part_ids", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("md5", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("completed_at", sa.BigInteger(), nullable=True),
        sa.Column("cancelled_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["file_id"], ["files.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_uploads_tenant_id_id", "uploads", ["tenant_id", "id"])
    op.create_index("ix_uploads_status_expires_at", "uploads", ["status", "expires_at"])
    op.create_table(
        "upload_parts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("upload_id", sa.String(length=40), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("head", sa.LargeBinary(), nullable=False),
        sa.Column("object_key", sa.String(length=1024), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["upload_id"], ["uploads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_upload_parts_upload_id_id", "upload_parts", ["upload_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_upload_parts_upload_id_id", table_name="upload_parts")
    op.drop_table("upload_parts")
    op.drop_index("ix_uploads_status_expires_at", table_name="uploads")
    op.drop_index("ix_uploads_tenant_id_id", table_name="uploads")
    op.drop_table("uploads")
