"""/v1/files: streamed upload, list, retrieve, content, delete."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, request, stream_with_context

from api import context
from api.idempotency import idempotent
from api.schemas import file_object, page, page_params, query_text
from jobs import service
from jobs.errors import InvalidRequest
from storage.objects import CHUNK

bp = Blueprint("files", __name__)
UPLOADS = {"files.create"}  # the endpoints whose bodies may be as large as an upload


@bp.post("/files")
@idempotent
def create() -> Any:
    upload = request.files.get("file")
    if upload is None:
        raise InvalidRequest("a multipart field 'file' is required", param="file")
    filename = upload.filename or "upload"
    if "\x00" in filename:
        raise InvalidRequest("the file name must not contain NUL", param="file")
    purpose = request.form.get("purpose", "")
    f = service.create_file(context(), g.tenant_id, filename, purpose, upload.stream)
    return file_object(f)


@bp.get("/files")
def list_() -> Any:
    after, limit = page_params()
    files, more = service.list_files(context(), g.tenant_id, after, limit,
                                     query_text("purpose"))
    return page([file_object(f) for f in files], more)


@bp.get("/files/<file_id>")
def retrieve(file_id: str) -> Any:
    return file_object(service.get_file(context(), g.tenant_id, file_id))


@bp.get("/files/<file_id>/content")
def content(file_id: str) -> Response:
    f, stream = service.open_file_content(context(), g.tenant_id, file_id)

    def body() -> Any:
        with stream:
            while block := stream.read(CHUNK):
                yield block

    mimetype = "application/octet-stream" if f.format == "parquet" else "application/jsonl"
    return Response(stream_with_context(body()), mimetype=mimetype,
                    headers={"content-length": str(f.bytes)})


@bp.delete("/files/<file_id>")
def delete(file_id: str) -> Any:
    service.delete_file(context(), g.tenant_id, file_id)
    return {"id": file_id, "object": "file", "deleted": True}
