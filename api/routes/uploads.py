"""/v1/uploads: create an upload, add its parts (streamed), complete it into a File,
cancel it. The use cases are jobs/batches/uploads.py's."""

from __future__ import annotations

from flask import g, request

from api.current import context
from api.idempotency import idempotent
from api.request_parsing import json_body
from api.routes.contract import Blueprint
from jobs.batches import uploads
from jobs.core.errors import InvalidRequest, shown
from jobs.protocol.objects.files import PartUpload, UploadObject, UploadPartObject
from jobs.protocol.validation import parse_model

bp = Blueprint("uploads", __name__, access="project")
PARTS = {"uploads.add_part"}  # the endpoints whose bodies are a part (and its form)
FORM_SLACK = 64 * 1024  # a part's body: its bytes, plus this much of multipart framing


@bp.post("/uploads", body=uploads.UploadCreate)
@idempotent
def create() -> UploadObject:
    """Create an upload: a file of a declared size, sent in parts."""
    req = parse_model(uploads.UploadCreate, json_body())
    up = uploads.create(context(), g.tenant_id, req)
    return UploadObject.of(up, uploads.status_of(up))


@bp.post("/uploads/<upload_id>/parts", upload=PartUpload)
@idempotent
def add_part(upload_id: str) -> UploadPartObject:
    """Add a part: the multipart field ``data``, stored as it is (its order is given at
    completion)."""
    ctx = context()
    uploads.check_pending(ctx, g.tenant_id, upload_id)  # before the body is read
    names = set(request.form) | set(request.files)
    unknown = sorted(names - {"data"})
    if unknown:
        raise InvalidRequest(f"unknown fields: {', '.join(shown(n) for n in unknown)}; a "
                             "part is the multipart field 'data' alone", param=unknown[0])
    data = request.files.getlist("data")
    if len(data) != 1:
        raise InvalidRequest("a part is one multipart field 'data' (a file)"
                             + ("" if data else "; none was sent"), param="data")
    part = uploads.add_part(ctx, g.tenant_id, upload_id, data[0].stream)
    return UploadPartObject.of(part)


@bp.post("/uploads/<upload_id>/complete", body=uploads.UploadComplete)
def complete(upload_id: str) -> UploadObject:
    """Complete the upload: its parts, in the order of ``part_ids``, become a File."""
    ctx = context()
    uploads.check_exists(ctx, g.tenant_id, upload_id)  # another project's: 404, whatever
    req = parse_model(uploads.UploadComplete, json_body())
    up, f = uploads.complete(ctx, g.tenant_id, upload_id, req)
    return UploadObject.of(up, uploads.status_of(up), f)


@bp.post("/uploads/<upload_id>/cancel", errors={400})
def cancel(upload_id: str) -> UploadObject:
    """Cancel the upload: no part may be added, and those added are deleted."""
    up = uploads.cancel(context(), g.tenant_id, upload_id)
    return UploadObject.of(up, uploads.status_of(up))
