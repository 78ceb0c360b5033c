"""Upload parts in place: on S3, an upload's parts are the parts of one multipart upload.

``uploads.store_upload_id``: the id of the multipart upload of the upload's object
(NULL on a store that keeps each part as an object, and for every existing upload);
``uploads.parts_started``: part numbers given so far. ``upload_parts.number`` and
``upload_parts.etag``: a part's number and ETag in that multipart upload (NULL for a
part stored as an object of its own).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 09:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("uploads", sa.Column("store_upload_id", sa.String(1024), nullable=True))
    op.add_column("uploads", sa.Column("parts_started", sa.Integer(), nullable=False,
                                       server_default="0"))
    op.add_column("upload_parts", sa.Column("number", sa.Integer(), nullable=True))
    op.add_column("upload_parts", sa.Column("etag", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("upload_parts", "etag")
    op.drop_column("upload_parts", "number")
    op.drop_column("uploads", "parts_started")
    op.drop_column("uploads", "store_upload_id")
