"""Files and uploads: the File, Upload and Upload part objects (each built from its row),
and the multipart forms that make a file or add an upload's part."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field

from jobs.core.schema import File
from jobs.core.status import UploadStatus
from jobs.core.upload_tables import Upload, UploadPart
from jobs.protocol.objects.common import Out


class FileObject(Out):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"]
    expires_at: int | None
    status_details: str | None

    @classmethod
    def of(cls, f: File) -> Self:
        return cls(id=f.id, bytes=f.bytes, created_at=f.created_at, filename=f.filename,
                   purpose=f.purpose, status="processed", expires_at=f.expires_at,
                   status_details=None)


class FileUpload(BaseModel):
    """The multipart form of ``POST /v1/files`` (``expires_after`` as the SDK sends it:
    two fields)."""

    file: bytes
    purpose: Literal["batch"]
    expires_after_anchor: Literal["created_at"] | None = Field(
        default=None, alias="expires_after[anchor]")
    expires_after_seconds: int | None = Field(default=None, alias="expires_after[seconds]",
                                              ge=3600, le=30 * 86400)


class UploadObject(Out):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: UploadStatus
    file: FileObject | None

    @classmethod
    def of(cls, up: Upload, status: UploadStatus, f: File | None = None) -> Self:
        """``status`` as answered (jobs.batches.uploads.status_of); ``f`` is the File it
        made (once completed)."""
        return cls(id=up.id, bytes=up.bytes, created_at=up.created_at,
                   expires_at=up.expires_at, filename=up.filename, purpose=up.purpose,
                   status=status, file=FileObject.of(f) if f is not None else None)


class UploadPartObject(Out):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str

    @classmethod
    def of(cls, p: UploadPart) -> Self:
        return cls(id=p.id, created_at=p.created_at, upload_id=p.upload_id)


class PartUpload(BaseModel):
    """The multipart form of ``POST /v1/uploads/{upload_id}/parts``."""

    data: bytes
