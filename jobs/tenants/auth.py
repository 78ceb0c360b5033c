"""Who a request speaks for: project API keys and admin keys, made, stored as their
sha256 and checked on every request."""

from __future__ import annotations

import hashlib
import secrets
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.core.access_tables import AdminKey, ApiKey
from jobs.core.context import Context
from jobs.core.errors import PermissionDenied, Unauthorized
from jobs.core.schema import Tenant, new_id, now
from jobs.tenants import queries as tenant_queries

KEY_PREFIX = "iq-"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_tenant(ctx: Context, name: str) -> tuple[str, str]:
    """A tenant and its first API key; returns (tenant_id, key). The key is shown once."""
    key = new_key()
    with ctx.db.session() as s:
        return _store_key(s, name, key), key


def ensure_key(ctx: Context, tenant_name: str, key: str) -> str:
    """Make ``key`` valid for the tenant (idempotent); used for the dev key of ``inferq up``."""
    with ctx.db.session() as s:
        if (tid := tenant_queries.tenant_for_key_hash(s, hash_key(key))) is not None:
            return tid
        return _store_key(s, tenant_name, key)


def _store_key(s: Session, tenant_name: str, key: str) -> str:
    """Store ``key`` for the tenant named ``tenant_name`` (created if new); its id."""
    tenant = s.scalar(select(Tenant).where(Tenant.name == tenant_name))
    if tenant is None:
        tenant = Tenant(id=new_id("proj_"), name=tenant_name)
        s.add(tenant)
        s.flush()
    s.add(ApiKey(id=new_id("key_"), tenant_id=tenant.id, key_hash=hash_key(key),
                 prefix=key[:10], suffix=key[-4:]))
    return tenant.id


class Principal(NamedTuple):
    """Who a project key speaks for."""

    tenant_id: str
    api_key_id: str


def authenticate(ctx: Context, key: str | None) -> Principal:
    """The project and key behind ``key``. Every request reads the key's row, so a
    revoked key, an archived project or an expired key is refused at once in every
    API process. ``last_used_at`` is written at most once a minute per key."""
    if not key:
        raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'")
    t = now()
    with ctx.db.session() as s:
        row = tenant_queries.key_principal(s, hash_key(key), t)
        if row is not None:
            tenant_queries.touch_key(s, row.api_key_id, t)
    if row is None:
        raise Unauthorized("Incorrect API key provided")
    return Principal(row.tenant_id, row.api_key_id)


def authenticate_admin(ctx: Context, key: str | None) -> str:
    """The admin key behind ``key``; a project key is refused (403), any other 401."""
    if not key:
        raise Unauthorized("Missing admin API key: send 'Authorization: Bearer <admin key>'")
    with ctx.db.session() as s:
        admin_id = tenant_queries.admin_key_id(s, hash_key(key))
        if admin_id is None and tenant_queries.key_principal(s, hash_key(key), now()) is not None:
            raise PermissionDenied("a project API key cannot use the Admin API: use an "
                                   "admin key (OPENAI_ADMIN_KEY)")
    if admin_id is None:
        raise Unauthorized("Incorrect admin API key provided")
    return admin_id


def ensure_admin_key(ctx: Context, key: str) -> str:
    """Make ``key`` a valid admin key (idempotent); used for the admin key of ``inferq up``."""
    with ctx.db.session() as s:
        if (admin_id := tenant_queries.admin_key_id(s, hash_key(key))) is not None:
            return admin_id
        k = AdminKey(id=new_id("key_"), key_hash=hash_key(key), prefix=key[:10],
                     suffix=key[-4:], name="inferq up")
        s.add(k)
        return k.id


def create_admin_key(ctx: Context, name: str) -> str:
    """A new admin key (its value, shown once; stored as its sha256): how a deployment
    without ``inferq up`` gets its first one (``inferq admin-key``)."""
    value = "iq-admin-" + secrets.token_urlsafe(32)
    with ctx.db.session() as s:
        s.add(AdminKey(id=new_id("key_"), key_hash=hash_key(value), prefix=value[:10],
                       suffix=value[-4:], name=name, created_at=now()))
    return value
