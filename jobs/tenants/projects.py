"""Use cases of the Admin API: projects (tenants), their service accounts, API keys and
per-model rate-limit settings.

A project is a tenant: every file, batch and job belongs to one. A key's value is
shown once, when it is created, and stored as its sha256; revoking it sets
``revoked_at``, which ``jobs.tenants.auth.authenticate`` reads on every request, so it is
refused at once in every API process. The limits are only stored here (NULL: no
limit); ``jobs.tenants.limits`` enforces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.core.access_tables import ApiKey, RateLimit, ServiceAccount
from jobs.core.context import Context
from jobs.core.errors import Conflict, InvalidRequest, NotFound, shown
from jobs.core.schema import Tenant, new_id, now
from jobs.fleet import registry
from jobs.tenants import limits
from jobs.tenants import queries as tenant_queries
from jobs.tenants.auth import hash_key, new_key

RATE_LIMIT_PREFIX = "rl-"
# The limit kinds a project may have per model (columns of ``rate_limits``).
LIMIT_FIELDS = ("max_requests_per_1_minute", "max_tokens_per_1_minute",
                "max_requests_per_1_day", "batch_1_day_max_input_tokens",
                "max_concurrent_streams", "max_tokens_per_realtime_request")
MAX_WEIGHT = 10_000


# Projects --------------------------------------------------------------------------------


def create_project(ctx: Context, name: str, weight: int | None = None) -> Tenant:
    t = Tenant(id=new_id("proj_"), name=name, created_at=now(), weight=weight or 1)
    try:
        with ctx.db.session() as s:
            s.add(t)
    except IntegrityError:
        raise _name_taken(name) from None
    return t


def _name_taken(name: str | None) -> Conflict:
    return Conflict(f"a project named {shown(name)} exists already: project names are unique",
                    param="name", code="project_exists")


def get_project(ctx: Context, project_id: str) -> Tenant:
    with ctx.db.session() as s:
        return _project(s, project_id)


def _project(s: Session, project_id: str, lock: bool = False, active: bool = False) -> Tenant:
    t = tenant_queries.get_tenant(s, project_id, lock=lock)
    if t is None:
        raise NotFound(f"No such project: {shown(project_id)}", param="project_id")
    if active and t.archived_at is not None:
        raise Conflict(f"project {t.id} is archived: an archived project cannot be changed "
                       "or given keys", param="project_id", code="project_archived")
    return t


def list_projects(ctx: Context, after: str | None, limit: int,
                  include_archived: bool) -> tuple[list[Tenant], bool]:
    where = [] if include_archived else [Tenant.archived_at.is_(None)]
    with ctx.db.session() as s:
        return tenant_queries.page_oldest_first(s, Tenant, where, after, limit)


def update_project(ctx: Context, project_id: str, name: str | None,
                   weight: int | None) -> Tenant:
    try:
        with ctx.db.session() as s:
            t = _project(s, project_id, lock=True, active=True)
            if name is not None:
                t.name = name
            if weight is not None:
                t.weight = weight
    except IntegrityError:
        raise _name_taken(name) from None
    return t


def archive_project(ctx: Context, project_id: str) -> Tenant:
    """Archive (idempotent): its keys are refused from the next request on."""
    with ctx.db.session() as s:
        t = _project(s, project_id, lock=True)
        if t.archived_at is None:
            t.archived_at = now()
    return t


# Service accounts and keys ------------------------------------------------------------------


@dataclass(frozen=True)
class NewKey:
    """A key just created: its row and its value (shown this once)."""

    key: ApiKey
    value: str


def create_service_account(ctx: Context, project_id: str, name: str, key_only: bool = False,
                           expires_in_seconds: int | None = None
                           ) -> tuple[ServiceAccount, NewKey | None]:
    """A service account; with its first key unless ``key_only`` (OpenAI's
    ``create_service_account_only``: role ``none``, no key)."""
    t = now()
    with ctx.db.session() as s:
        _project(s, project_id, lock=True, active=True)
        sa = ServiceAccount(id=new_id("svc_acct_"), tenant_id=project_id, name=name,
                            role="none" if key_only else "member", created_at=t)
        s.add(sa)
        s.flush()
        made = None if key_only else _account_key(s, sa, name, expires_in_seconds, t)
    return sa, made


def _account_key(s: Session, sa: ServiceAccount, name: str, expires_in_seconds: int | None,
             t: int) -> NewKey:
    value = new_key()
    k = ApiKey(id=new_id("key_"), tenant_id=sa.tenant_id, key_hash=hash_key(value),
               prefix=value[:10], suffix=value[-4:], name=name, service_account_id=sa.id,
               created_at=t, expires_at=None if expires_in_seconds is None
               else t + expires_in_seconds)
    s.add(k)
    s.flush()
    return NewKey(k, value)


def list_service_accounts(ctx: Context, project_id: str, after: str | None,
                          limit: int) -> tuple[list[ServiceAccount], bool]:
    with ctx.db.session() as s:
        _project(s, project_id)
        return tenant_queries.page_oldest_first(s, ServiceAccount,
                                      [ServiceAccount.tenant_id == project_id], after, limit)


def get_service_account(ctx: Context, project_id: str, service_account_id: str
                        ) -> ServiceAccount:
    with ctx.db.session() as s:
        return _service_account(s, project_id, service_account_id)


def _service_account(s: Session, project_id: str, service_account_id: str) -> ServiceAccount:
    _project(s, project_id)
    sa = s.scalar(select(ServiceAccount).where(ServiceAccount.id == service_account_id,
                                               ServiceAccount.tenant_id == project_id))
    if sa is None:
        raise NotFound(f"No such service account in project {project_id}: "
                       f"{shown(service_account_id)}", param="service_account_id")
    return sa


def delete_service_account(ctx: Context, project_id: str, service_account_id: str) -> None:
    """Delete it; its keys go with it (refused from the next request on)."""
    with ctx.db.session() as s:
        sa = _service_account(s, project_id, service_account_id)
        s.delete(sa)


def create_key(ctx: Context, project_id: str, service_account_id: str, name: str | None,
               expires_in_seconds: int | None) -> NewKey:
    t = now()
    with ctx.db.session() as s:
        _project(s, project_id, lock=True, active=True)
        sa = _service_account(s, project_id, service_account_id)
        return _account_key(s, sa, name if name is not None else sa.name, expires_in_seconds, t)


@dataclass(frozen=True)
class KeyView:
    """A live key with what its ProjectAPIKey object shows."""

    key: ApiKey
    owner: ServiceAccount | None
    project_active: bool

    @property
    def active(self) -> bool:
        """Whether it authenticates now: its project not archived, the key not expired."""
        k = self.key
        return self.project_active and (k.expires_at is None or k.expires_at > now())


OWNER_ACCESS = ("active", "inactive", "any")


def list_keys(ctx: Context, project_id: str, after: str | None, limit: int,
              owner_project_access: str = "any") -> tuple[list[KeyView], bool]:
    """The project's keys that are not revoked; ``owner_project_access`` keeps only
    those that authenticate now (``active``) or only those that do not (``inactive``)."""
    with ctx.db.session() as s:
        t = _project(s, project_id)
        where: list[Any] = [ApiKey.tenant_id == project_id, ApiKey.revoked_at.is_(None)]
        if owner_project_access != "any":
            at = now()
            live = (ApiKey.expires_at.is_(None)) | (ApiKey.expires_at > at)
            if t.archived_at is not None:
                if owner_project_access == "active":
                    return [], False
            else:
                where.append(live if owner_project_access == "active" else ~live)
        keys, more = tenant_queries.page_oldest_first(s, ApiKey, where, after, limit)
        owners = tenant_queries.service_accounts_by_id(s, {k.service_account_id for k in keys
                                                 if k.service_account_id})
        return [KeyView(k, owners.get(k.service_account_id or ""), t.archived_at is None)
                for k in keys], more


def get_key(ctx: Context, project_id: str, api_key_id: str) -> KeyView:
    with ctx.db.session() as s:
        t = _project(s, project_id)
        k = _key(s, project_id, api_key_id)
        owner = s.get(ServiceAccount, k.service_account_id) if k.service_account_id else None
        return KeyView(k, owner, t.archived_at is None)


def _key(s: Session, project_id: str, api_key_id: str, lock: bool = False) -> ApiKey:
    q = select(ApiKey).where(ApiKey.id == api_key_id, ApiKey.tenant_id == project_id,
                             ApiKey.revoked_at.is_(None))
    k = s.scalar(q.with_for_update() if lock else q)
    if k is None:
        raise NotFound(f"No such API key in project {project_id}: {shown(api_key_id)}",
                       param="api_key_id")
    return k


def revoke_key(ctx: Context, project_id: str, api_key_id: str) -> None:
    """Revoke: the key is refused from the next request on, in every API process (the
    row stays, so usage keeps naming it)."""
    with ctx.db.session() as s:
        _project(s, project_id)
        _key(s, project_id, api_key_id, lock=True).revoked_at = now()


# Rate limits ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitView:
    """One model's effective limits for a project (its row over the deployment's
    defaults, as ``jobs.tenants.limits`` enforces them): None is no limit of that kind.
    ``stored`` is the row as set (None: the deployment default)."""

    model: str
    values: dict[str, int | None]
    stored: dict[str, int | None]

    @property
    def id(self) -> str:
        return RATE_LIMIT_PREFIX + self.model


def model_of(rate_limit_id: str) -> str:
    if not rate_limit_id.startswith(RATE_LIMIT_PREFIX):
        raise NotFound(f"No such rate limit: {shown(rate_limit_id)} (ids are "
                       f"'{RATE_LIMIT_PREFIX}<model>')", param="rate_limit_id")
    return rate_limit_id[len(RATE_LIMIT_PREFIX):]


def list_limits(ctx: Context, project_id: str) -> list[LimitView]:
    """One entry per registered model (by name), with the project's values."""
    names = sorted(m.name for m in registry.list_models(ctx))
    with ctx.db.session() as s:
        _project(s, project_id)
        rows = {r.model: r for r in tenant_queries.rate_limits_of(s, project_id)}
    return [_view(ctx, n, rows.get(n)) for n in names]


def _view(ctx: Context, model: str, row: RateLimit | None) -> LimitView:
    effective = limits.from_row(row, limits.defaults(ctx))
    values = (effective.requests_per_minute, effective.tokens_per_minute,
              effective.requests_per_day, effective.batch_day_input_tokens,
              effective.concurrent_streams, effective.realtime_request_tokens)
    return LimitView(model, {f: v or None for f, v in zip(LIMIT_FIELDS, values, strict=True)},
                     {f: None if row is None else getattr(row, f) for f in LIMIT_FIELDS})


def update_limit(ctx: Context, project_id: str, rate_limit_id: str,
                 changes: dict[str, int | None]) -> LimitView:
    """Set the given limits of one registered model: a number (0: no limit), or None
    (back to the deployment's default)."""
    model = model_of(rate_limit_id)
    if registry.get_default(ctx, model) is None:
        raise NotFound(f"No such rate limit: {shown(rate_limit_id)}: no model "
                       f"{shown(model)} is registered", param="rate_limit_id")
    unknown = set(changes) - set(LIMIT_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown limit(s): {', '.join(sorted(unknown))}")
    with ctx.db.session() as s:
        _project(s, project_id, lock=True, active=True)
        row = tenant_queries.upsert_rate_limit(s, project_id, model, changes, now())
        return _view(ctx, model, row)
