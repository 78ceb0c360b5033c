"""The tables of uploads in parts (``POST /v1/uploads``; jobs/batches/uploads.py): an
upload and its parts. Columns are NOT NULL unless stated (as in ``jobs.core.schema``)."""

from __future__ import annotations

import builtins
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, LargeBinary, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from jobs.core.schema import Base, now


class Upload(Base):
    """A file sent in parts (``POST /v1/uploads``; jobs/batches/uploads.py). ``status``
    is pending until it is completed (``file_id`` is then the File made of its parts,
    ``part_ids`` their order, ``md5`` the checksum verified, if one was given) or
    cancelled; a pending upload past ``expires_at`` is expired, whether or not the
    janitor has written so yet. ``file_expires_after``: the File's ``expires_at`` is
    its ``created_at`` plus these seconds (``expires_after``)."""

    __tablename__ = "uploads"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    mime_type: Mapped[str] = mapped_column(String(128))
    bytes: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))  # UploadStatus
    file_expires_after: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"), nullable=True)
    part_ids: Mapped[list[Any] | None] = mapped_column(JSONB, nullable=True)
    md5: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    completed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cancelled_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # On a store that takes parts in place (S3): the id of the multipart upload of its
    # object (storage.keys.upload_target) its parts go into, and the part numbers given.
    store_upload_id: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    parts_started: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        Index("ix_uploads_tenant_id_id", "tenant_id", "id"),
        Index("ix_uploads_status_expires_at", "status", "expires_at"),
    )


class UploadPart(Base):
    """One part of an upload: an object of its own until the upload ends, or a part of
    the multipart upload of the upload's object (``number``)."""

    __tablename__ = "upload_parts"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.id", ondelete="CASCADE"))
    bytes: Mapped[int] = mapped_column(BigInteger)
    # its first bytes (up to 4): the composed file's format is told from the parts' heads
    head: Mapped[builtins.bytes] = mapped_column(LargeBinary)  # (``bytes`` is a column here)
    object_key: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    # A part in place (Upload.store_upload_id): its number and ETag in the multipart
    # upload of ``object_key``; NULL for a part stored as an object of its own.
    number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    etag: Mapped[str | None] = mapped_column(String(128), nullable=True)

    __table_args__ = (Index("ix_upload_parts_upload_id_id", "upload_id", "id"),)
