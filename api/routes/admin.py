"""/v1/organization: the Admin API's projects, service accounts, keys and rate limits.

Admin keys only (``api/__init__.py`` authenticates the blueprint). The shapes are the
``openai`` SDK's ``client.admin.organization.projects`` types, every required field
present; a project's ``weight`` (its share of the batch lanes), a rate limit's
``max_concurrent_streams`` and ``max_tokens_per_realtime_request``, and a project's data
locations (where its batches read and write datasets in place) are inferq extensions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from flask import request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.current import context
from api.request_parsing import ID, json_body, page_params
from api.routes.contract import PAGE, Blueprint, one_of, parameter
from jobs.batches import locations
from jobs.core.errors import InvalidRequest, NotFound, shown
from jobs.protocol.objects.admin import (
    ApiKey,
    DataLocation,
    NewKey,
    Project,
    RateLimit,
    ServiceAccount,
    ServiceAccountCreated,
)
from jobs.protocol.objects.common import Deleted, Page
from jobs.protocol.validation import INT64, parse_model
from jobs.tenants import projects as tenants

bp = Blueprint("admin", __name__, access="admin")

PATH_IDS = {"project_id": "project", "service_account_id": "service account",
            "api_key_id": "API key", "rate_limit_id": "rate limit",
            "location_id": "data location"}
NAME_MAX = 200
MAX_EXPIRY_S = 100 * 365 * 24 * 3600


@bp.before_request
def _check_path_ids() -> None:
    """An id no object can have is a 404 before any lookup (PostgreSQL refuses NUL)."""
    for name, value in (request.view_args or {}).items():
        if name in PATH_IDS and not ID.fullmatch(value):
            raise NotFound(f"No such {PATH_IDS[name]}: {shown(value)}", param=name)


# Request bodies ------------------------------------------------------------------------------

Limit = Annotated[int, Field(strict=True, ge=0, lt=INT64)]
Weight = Annotated[int, Field(strict=True, ge=1, le=tenants.MAX_WEIGHT)]
Expiry = Annotated[int, Field(strict=True, ge=1, le=MAX_EXPIRY_S)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


def _name(v: str | None) -> str | None:
    if v is not None and (not v.strip() or len(v) > NAME_MAX or not v.isprintable()):
        raise ValueError(f"a name is 1 to {NAME_MAX} printable characters")
    return v


class _Unsupported(_Body):
    """Fields of OpenAI's bodies that name things this service does not have: only
    null (or left out) is accepted."""

    external_key_id: None = None
    geography: None = None


class ProjectCreate(_Unsupported):
    name: Annotated[str, Field(strict=True)]
    residency: None = None
    weight: Weight | None = None

    _check = field_validator("name")(_name)


class ProjectUpdate(_Unsupported):
    name: Annotated[str, Field(strict=True)] | None = None
    weight: Weight | None = None

    _check = field_validator("name")(_name)


class ServiceAccountCreate(_Body):
    name: Annotated[str, Field(strict=True)]
    create_service_account_only: Annotated[bool, Field(strict=True)] | None = None
    expires_in_seconds: Expiry | None = None

    _check = field_validator("name")(_name)


class KeyCreate(_Body):
    name: Annotated[str, Field(strict=True)] | None = None
    expires_in_seconds: Expiry | None = None
    scopes: None = None

    _check = field_validator("name")(_name)


class RateLimitUpdate(_Body):
    """A number sets a limit (0: no limit of that kind); null clears the project's
    value, so the deployment's default (``INFERQ_DEFAULT_*``) applies."""

    max_requests_per_1_minute: Limit | None = None
    max_tokens_per_1_minute: Limit | None = None
    max_requests_per_1_day: Limit | None = None
    batch_1_day_max_input_tokens: Limit | None = None
    max_concurrent_streams: Annotated[int, Field(strict=True, ge=0, lt=2**31)] | None = None
    max_tokens_per_realtime_request: Limit | None = None
    max_audio_megabytes_per_1_minute: None = None
    max_images_per_1_minute: None = None


class LocationCreate(_Body):
    uri: Annotated[str, Field(strict=True, min_length=1, max_length=512)]
    access: Literal["read", "write", "read_write"]


def _body(cls: type[_Body], optional: bool = False) -> Any:
    if optional and not request.get_data(cache=True):
        return cls()
    return parse_model(cls, json_body(limit=64 * 1024))


def _flag(name: str) -> bool:
    raw = request.args.get(name, "false")
    if raw.lower() not in ("true", "false", "1", "0"):
        raise InvalidRequest(f"{name} must be true or false, got {shown(raw)}", param=name)
    return raw.lower() in ("true", "1")


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = request.args.get(name, default)
    if raw not in choices:
        raise InvalidRequest(f"{name} must be one of {', '.join(choices)}, got {shown(raw)}",
                             param=name)
    return raw


# Projects -----------------------------------------------------------------------------------


@bp.post("/projects", body=ProjectCreate, errors={409})
def create_project() -> Project:
    req: ProjectCreate = _body(ProjectCreate)
    return Project.of(tenants.create_project(context(), req.name, req.weight))


@bp.get("/projects", params=(*PAGE, parameter("include_archived", "query",
                                                      {"type": "boolean"})))
def list_projects() -> Page[Project]:
    after, limit = page_params()
    rows, more = tenants.list_projects(context(), after, limit, _flag("include_archived"))
    return Page[Project].of([Project.of(t) for t in rows], more)


@bp.get("/projects/<project_id>")
def retrieve_project(project_id: str) -> Project:
    return Project.of(tenants.get_project(context(), project_id))


@bp.post("/projects/<project_id>", body=ProjectUpdate, optional_body=True, errors={409})
def update_project(project_id: str) -> Project:
    req: ProjectUpdate = _body(ProjectUpdate, optional=True)
    return Project.of(tenants.update_project(context(), project_id, req.name, req.weight))


@bp.post("/projects/<project_id>/archive", errors={409})
def archive_project(project_id: str) -> Project:
    return Project.of(tenants.archive_project(context(), project_id))


# Service accounts and keys -------------------------------------------------------------------


@bp.post("/projects/<project_id>/service_accounts", body=ServiceAccountCreate, errors={409})
def create_service_account(project_id: str) -> ServiceAccountCreated:
    tenants.get_project(context(), project_id)  # an unknown project: 404 whatever the body
    req: ServiceAccountCreate = _body(ServiceAccountCreate)
    sa, key = tenants.create_service_account(
        context(), project_id, req.name, bool(req.create_service_account_only),
        req.expires_in_seconds)
    return ServiceAccountCreated.of(sa, None if key is None else NewKey.of(key))


@bp.get("/projects/<project_id>/service_accounts", params=PAGE)
def list_service_accounts(project_id: str) -> Page[ServiceAccount]:
    after, limit = page_params()
    rows, more = tenants.list_service_accounts(context(), project_id, after, limit)
    return Page[ServiceAccount].of([ServiceAccount.of(sa) for sa in rows], more)


@bp.get("/projects/<project_id>/service_accounts/<service_account_id>")
def retrieve_service_account(project_id: str, service_account_id: str) -> ServiceAccount:
    return ServiceAccount.of(
        tenants.get_service_account(context(), project_id, service_account_id))


@bp.delete("/projects/<project_id>/service_accounts/<service_account_id>")
def delete_service_account(project_id: str, service_account_id: str) -> Deleted:
    tenants.delete_service_account(context(), project_id, service_account_id)
    return Deleted(id=service_account_id,
                   object="organization.project.service_account.deleted", deleted=True)


@bp.post("/projects/<project_id>/service_accounts/<service_account_id>/api_keys",
         body=KeyCreate, optional_body=True, errors={409})
def create_key(project_id: str, service_account_id: str) -> NewKey:
    req: KeyCreate = _body(KeyCreate, optional=True)
    return NewKey.of(tenants.create_key(context(), project_id, service_account_id, req.name,
                                        req.expires_in_seconds))


@bp.get("/projects/<project_id>/api_keys", params=(*PAGE, parameter(
    "owner_project_access", "query", one_of(tenants.OWNER_ACCESS, default="any"))))
def list_keys(project_id: str) -> Page[ApiKey]:
    after, limit = page_params()
    access = _choice("owner_project_access", tenants.OWNER_ACCESS, "any")
    rows, more = tenants.list_keys(context(), project_id, after, limit, access)
    return Page[ApiKey].of([ApiKey.of(v) for v in rows], more)


@bp.get("/projects/<project_id>/api_keys/<api_key_id>")
def retrieve_key(project_id: str, api_key_id: str) -> ApiKey:
    return ApiKey.of(tenants.get_key(context(), project_id, api_key_id))


@bp.delete("/projects/<project_id>/api_keys/<api_key_id>")
def delete_key(project_id: str, api_key_id: str) -> Deleted:
    tenants.revoke_key(context(), project_id, api_key_id)
    return Deleted(id=api_key_id, object="organization.project.api_key.deleted", deleted=True)


# Rate limits ----------------------------------------------------------------------------------


class ProjectRateLimit(RateLimit):
    """A rate limit with what one realtime generation may reserve (n x max_tokens; null:
    no cap), an inferq extension."""

    max_tokens_per_realtime_request: int | None = None


def _limit(v: tenants.LimitView) -> ProjectRateLimit:
    return ProjectRateLimit.of(v, context().settings.rate_limit_unlimited).model_copy(
        update={"max_tokens_per_realtime_request":
                v.values["max_tokens_per_realtime_request"]})


@bp.get("/projects/<project_id>/rate_limits", params=(*PAGE, parameter(
    "before", "query", {"type": "string"})))
def list_rate_limits(project_id: str) -> Page[ProjectRateLimit]:
    after, limit = page_params()
    before = request.args.get("before") or None
    if before is not None and not ID.fullmatch(before):
        raise InvalidRequest(f"before must be a rate limit id, got {shown(before)}",
                             param="before")
    views = tenants.list_limits(context(), project_id)
    ids = [v.id for v in views]
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise InvalidRequest(f"{name}: no such rate limit {cursor!r}; pass the id of an "
                                 "item from a previous page", param=name)
    if after is not None:
        views = views[ids.index(after) + 1:]
    if before is not None:
        views = [v for v in views if v.id < before][-limit:]
    return Page[ProjectRateLimit].of([_limit(v) for v in views[:limit]], len(views) > limit)


@bp.post("/projects/<project_id>/rate_limits/<rate_limit_id>", body=RateLimitUpdate,
         errors={409})
def update_rate_limit(project_id: str, rate_limit_id: str) -> ProjectRateLimit:
    tenants.get_project(context(), project_id)  # an unknown project: 404 whatever the body
    req: RateLimitUpdate = _body(RateLimitUpdate)
    changes = {f: getattr(req, f) for f in req.model_fields_set if f in tenants.LIMIT_FIELDS}
    if not changes:
        raise InvalidRequest("give at least one limit to set (a number) or clear (null): "
                             + ", ".join(tenants.LIMIT_FIELDS))
    return _limit(tenants.update_limit(context(), project_id, rate_limit_id, changes))


# Data locations (inferq extension): where a project's batches read and write in place -----


@bp.post("/projects/<project_id>/data_locations", body=LocationCreate, errors={409})
def create_location(project_id: str) -> DataLocation:
    tenants.get_project(context(), project_id)  # an unknown project: 404 whatever the body
    req: LocationCreate = _body(LocationCreate)
    return DataLocation.of(locations.add(context(), project_id, req.uri, req.access))


@bp.get("/projects/<project_id>/data_locations", params=PAGE)
def list_locations(project_id: str) -> Page[DataLocation]:
    return Page[DataLocation].of(
        [DataLocation.of(r) for r in locations.list_(context(), project_id)], False)


@bp.delete("/projects/<project_id>/data_locations/<location_id>")
def delete_location(project_id: str, location_id: str) -> Deleted:
    locations.remove(context(), project_id, location_id)
    return Deleted(id=location_id, object="organization.project.data_location.deleted",
                   deleted=True)
