"""Where a project's batches may read datasets and write outputs in place.

The deployment's object-store credentials may reach many buckets; a project reaches
only the URI prefixes an admin gave it (``POST
/v1/organization/projects/{id}/data_locations``), each with its access: ``read``
(batch inputs), ``write`` (batch outputs) or ``read_write``. A URI is allowed when it
lies under one of them at a path boundary (``s3://lake/team-a/`` covers
``s3://lake/team-a/reviews/*.parquet``, not ``s3://lake/team-ab/``). A file:// URI is
then resolved below that location's real path, and a symbolic link below it is refused
(storage.datasets.local_real): a link cannot lead a batch out of its location.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.core.access_tables import DataLocation
from jobs.core.context import Context
from jobs.core.errors import Conflict, InvalidRequest, NotFound, PermissionDenied, shown
from jobs.core.schema import new_id, now
from jobs.tenants import queries as tenant_queries
from storage.datasets import BadLocation, Location, parse

ACCESS = ("read", "write", "read_write")
Access = Literal["read", "write", "read_write"]
MAX_PER_PROJECT = 100


def location(uri: str, param: str) -> Location:
    """The parsed URI; InvalidRequest naming ``param`` if it is not one."""
    try:
        return parse(uri)
    except BadLocation as e:
        raise InvalidRequest(str(e), param=param, code="invalid_location") from None


def add(ctx: Context, project_id: str, uri: str, access: Access) -> DataLocation:
    loc = location(uri, "uri")
    if loc.is_glob:
        raise InvalidRequest("a data location is a prefix (s3://bucket/prefix/), not a glob",
                             param="uri", code="invalid_location")
    try:
        with ctx.db.session() as s:
            _project(s, project_id)
            n = len(s.scalars(select(DataLocation.id).where(
                DataLocation.tenant_id == project_id)).all())
            if n >= MAX_PER_PROJECT:
                raise Conflict(f"a project has at most {MAX_PER_PROJECT} data locations",
                               param="uri")
            row = DataLocation(id=new_id("loc_"), tenant_id=project_id, uri=loc.uri,
                               access=access, created_at=now())
            s.add(row)
    except IntegrityError:
        raise Conflict(f"project {project_id} has the location {shown(loc.uri)} already: "
                       "delete it to change its access", param="uri",
                       code="location_exists") from None
    return row


def list_(ctx: Context, project_id: str) -> list[DataLocation]:
    with ctx.db.session() as s:
        _project(s, project_id)
        return list(s.scalars(select(DataLocation).where(DataLocation.tenant_id == project_id)
                              .order_by(DataLocation.uri)))


def _project(s: Session, project_id: str) -> None:
    t = tenant_queries.get_tenant(s, project_id)
    if t is None:
        raise NotFound(f"No such project: {shown(project_id)}", param="project_id")


def remove(ctx: Context, project_id: str, location_id: str) -> None:
    with ctx.db.session() as s:
        row = s.get(DataLocation, location_id)
        if row is None or row.tenant_id != project_id:
            raise NotFound(f"No such data location: {shown(location_id)}",
                           param="location_id")
        s.delete(row)


def require(ctx: Context, tenant_id: str, loc: Location, need: Literal["read", "write"],
            param: str) -> Location:
    """PermissionDenied unless the project may ``need`` everything ``loc`` names; the
    location that allows it (the longest, when several do: a file:// dataset is
    resolved below it, storage.datasets.local_real)."""
    with ctx.db.session() as s:
        rows = s.scalars(select(DataLocation).where(DataLocation.tenant_id == tenant_id)).all()
    allowed = [root for row in rows if need in row.access
               and loc.within(root := parse(row.uri))]
    if allowed:
        return max(allowed, key=lambda root: len(root.key))
    raise PermissionDenied(
        f"this project may not {need} {shown(loc.uri, 200)}: an admin gives a project the "
        f"locations it may {need} (inferq projects locations add PROJECT URI --access "
        f"{need})", param=param)
