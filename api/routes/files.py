"""/v1/files: streamed upload, list, retrieve, content, delete."""

from __future__ import annotations

from typing import Any

from flask import Response, g, request, stream_with_context
from pydantic import ValidationError

from api.current import context
from api.idempotency import idempotent
from api.request_parsing import page_params, query_text
from api.routes.contract import BINARY, PAGE, TEXT, Blueprint, parameter
from jobs.batches import service
from jobs.core.errors import InvalidRequest
from jobs.protocol.batch import MAX_FILE_EXPIRY_S, MIN_FILE_EXPIRY_S, ExpiresAfter
from jobs.protocol.objects.common import Deleted, Page
from jobs.protocol.objects.files import FileObject, FileUpload
from storage.objects import CHUNK

bp = Blueprint("files", __name__, access="project")
UPLOADS = {"files.create"}  # the endpoints whose bodies may be as large as an upload


@bp.post("/files", upload=FileUpload)
@idempotent
def create() -> FileObject:
    upload = request.files.get("file")
    if upload is None:
        raise InvalidRequest("a multipart field 'file' is required", param="file")
    filename = upload.filename or "upload"
    if "\x00" in filename:
        raise InvalidRequest("the file name must not contain NUL", param="file")
    purpose = request.form.get("purpose", "")
    f = service.create_file(context(), g.tenant_id, filename, purpose, upload.stream,
                            expires_after(request.form))
    return FileObject.of(f)


FORM_FIELDS = {"purpose", "expires_after[anchor]", "expires_after[seconds]"}


def expires_after(form: Any) -> int | None:
    """The seconds of ``expires_after`` (sent as the form fields ``expires_after[anchor]``
    and ``expires_after[seconds]``), if given; any other field is refused by name."""
    if unknown := sorted(set(form) - FORM_FIELDS):
        raise InvalidRequest(f"unsupported parameter: {unknown[0]!r} (files.create takes "
                             "file, purpose and expires_after)", param=unknown[0],
                             code="unsupported_parameter")
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    try:
        given = ExpiresAfter.model_validate(
            {"anchor": anchor, "seconds": int(seconds) if seconds is not None else None})
    except (ValueError, ValidationError):
        raise InvalidRequest(
            "expires_after must be {anchor: 'created_at', seconds: "
            f"{MIN_FILE_EXPIRY_S}..{MAX_FILE_EXPIRY_S}}}", param="expires_after") from None
    return given.seconds


@bp.get("/files", params=(*PAGE, parameter("purpose", "query", {"type": "string",
                                                                  "maxLength": 64})))
def list_() -> Page[FileObject]:
    after, limit = page_params()
    files, more = service.list_files(context(), g.tenant_id, after, limit,
                                     query_text("purpose"))
    return Page[FileObject].of([FileObject.of(f) for f in files], more)


@bp.get("/files/<file_id>")
def retrieve(file_id: str) -> FileObject:
    return FileObject.of(service.get_file(context(), g.tenant_id, file_id))


@bp.get("/files/<file_id>/content", media={"application/jsonl": TEXT,
                                          "application/octet-stream": BINARY})
def content(file_id: str) -> Response:
    f, stream = service.open_file_content(context(), g.tenant_id, file_id)

    def body() -> Any:
        with stream:
            while block := stream.read(CHUNK):
                yield block

    mimetype = "application/octet-stream" if f.format == "parquet" else "application/jsonl"
    return Response(stream_with_context(body()), mimetype=mimetype,
                    headers={"content-length": str(f.bytes)})


@bp.delete("/files/<file_id>", errors={409})
def delete(file_id: str) -> Deleted:
    service.delete_file(context(), g.tenant_id, file_id)
    return Deleted(id=file_id, object="file", deleted=True)
