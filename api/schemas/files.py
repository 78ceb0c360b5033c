"""Files and uploads: the File, Upload and Upload part objects (and their builders), and
the multipart forms that make a file or add an upload's part."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api.schemas.common import Out
from jobs.batches.uploads import status_of
from jobs.core.schema import File
from jobs.core.upload_tables import Upload, UploadPart


def file_object(f: File) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": f.expires_at, "status_details": None}


def upload_object(up: Upload, f: File | None) -> dict[str, Any]:
    """The OpenAI upload object; ``file`` is the File it made (once completed)."""
    return {"id": up.id, "object": "upload", "bytes": up.bytes, "created_at": up.created_at,
            "expires_at": up.expires_at, "filename": up.filename, "purpose": up.purpose,
            "status": status_of(up).value, "file": file_object(f) if f is not None else None}


def upload_part_object(p: UploadPart) -> dict[str, Any]:
    return {"id": p.id, "object": "upload.part", "created_at": p.created_at,
            "upload_id": p.upload_id}


class FileObject(Out):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"]
    expires_at: int | None
    status_details: str | None


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
    object: Literal["upload"]
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None


class UploadPartObject(Out):
    id: str
    object: Literal["upload.part"]
    created_at: int
    upload_id: str


class PartUpload(BaseModel):
    """The multipart form of ``POST /v1/uploads/{upload_id}/parts``."""

    data: bytes
