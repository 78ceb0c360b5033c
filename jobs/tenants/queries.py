"""Queries over the schema of projects, service accounts, keys and rate limits.
Functions take a Session and never commit: the caller's unit of work decides."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobs.core.access_tables import AdminKey, ApiKey, RateLimit, ServiceAccount
from jobs.core.errors import InvalidRequest
from jobs.core.schema import Tenant


def tenant_for_key_hash(s: Session, key_hash: str) -> str | None:
    return s.scalar(select(ApiKey.tenant_id).where(ApiKey.key_hash == key_hash,
                                                   ApiKey.revoked_at.is_(None)))


class KeyPrincipal(NamedTuple):
    tenant_id: str
    api_key_id: str


def key_principal(s: Session, key_hash: str, at: int) -> KeyPrincipal | None:
    """The live key with this hash: not revoked, not expired, its project not archived."""
    row = s.execute(
        select(ApiKey.tenant_id, ApiKey.id).join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None),
               (ApiKey.expires_at.is_(None)) | (ApiKey.expires_at > at),
               Tenant.archived_at.is_(None))).first()
    return None if row is None else KeyPrincipal(row[0], row[1])


def admin_key_id(s: Session, key_hash: str) -> str | None:
    return s.scalar(select(AdminKey.id).where(AdminKey.key_hash == key_hash,
                                              AdminKey.revoked_at.is_(None)))


def touch_key(s: Session, api_key_id: str, at: int) -> None:
    """Record use, at most once a minute (a write per request would serialize keys)."""
    s.execute(update(ApiKey).where(ApiKey.id == api_key_id,
                                   (ApiKey.last_used_at.is_(None))
                                   | (ApiKey.last_used_at < at - 60))
              .values(last_used_at=at))


def get_tenant(s: Session, tenant_id: str, lock: bool = False) -> Tenant | None:
    q = select(Tenant).where(Tenant.id == tenant_id)
    return s.scalar(q.with_for_update() if lock else q)


def page_oldest_first(s: Session, model: type[Tenant] | type[ServiceAccount] | type[ApiKey],
                      where: list[Any], after: str | None, limit: int
                      ) -> tuple[list[Any], bool]:
    """Oldest first (ids are time-ordered); ``after`` must be an id among ``where``'s
    rows (a cursor from an earlier page), else a 400."""
    q = select(model).where(*where)
    if after:
        if s.scalar(select(model.id).where(model.id == after, *where)) is None:
            raise InvalidRequest(f"after: no such object {after!r}; pass the id of an item "
                                 "from a previous page", param="after")
        q = q.where(model.id > after)
    rows = list(s.scalars(q.order_by(model.id).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def service_accounts_by_id(s: Session, ids: set[str]) -> dict[str, ServiceAccount]:
    if not ids:
        return {}
    return {sa.id: sa for sa in s.scalars(select(ServiceAccount)
                                          .where(ServiceAccount.id.in_(ids)))}


def rate_limits_of(s: Session, tenant_id: str) -> list[RateLimit]:
    return list(s.scalars(select(RateLimit).where(RateLimit.tenant_id == tenant_id)))


def upsert_rate_limit(s: Session, tenant_id: str, model: str, values: dict[str, int | None],
                      at: int) -> RateLimit:
    """Set the given columns of the project's row for ``model`` (made if new), in one
    statement, so concurrent updates of different limits never lose one another."""
    from sqlalchemy.dialects.postgresql import insert

    stmt = insert(RateLimit).values(tenant_id=tenant_id, model=model, updated_at=at, **values)
    stmt = stmt.on_conflict_do_update(index_elements=[RateLimit.tenant_id, RateLimit.model],
                                      set_={**values, "updated_at": at})
    row = s.scalar(stmt.returning(RateLimit), execution_options={"populate_existing": True})
    assert row is not None
    return row
