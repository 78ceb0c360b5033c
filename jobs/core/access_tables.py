"""The tables of a project's access: its service accounts and API keys, its rate limits
per model and the object-store locations its batches may use in place; and the Admin
API's own keys. Columns are NOT NULL unless stated (as in ``jobs.core.schema``)."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from jobs.core.schema import Base, now


class ServiceAccount(Base):
    """A project's non-human owner of API keys."""

    __tablename__ = "service_accounts"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16), default="member")
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)

    __table_args__ = (Index("ix_service_accounts_tenant_id_id", "tenant_id", "id"),)


class ApiKey(Base):
    """A project key, stored as its sha256 (the value is shown once). ``prefix`` and
    ``suffix`` make its redacted value."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    suffix: Mapped[str] = mapped_column(String(8), default="", server_default="")
    name: Mapped[str] = mapped_column(String(200), default="", server_default="")
    service_account_id: Mapped[str | None] = mapped_column(
        ForeignKey("service_accounts.id", ondelete="CASCADE"), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    last_used_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_api_keys_tenant_id_id", "tenant_id", "id"),)


class AdminKey(Base):
    """A key for the Admin API (``/v1/organization/...``); never a project key."""

    __tablename__ = "admin_api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    suffix: Mapped[str] = mapped_column(String(8), default="", server_default="")
    name: Mapped[str] = mapped_column(String(200), default="", server_default="")
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class RateLimit(Base):
    """A project's limits for one model; NULL is "no limit of this kind"."""

    __tablename__ = "rate_limits"
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                           primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    max_requests_per_1_minute: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_tokens_per_1_minute: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_requests_per_1_day: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    batch_1_day_max_input_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_concurrent_streams: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # n x max_tokens one realtime generation may reserve (jobs.tenants.limits)
    max_tokens_per_realtime_request: Mapped[int | None] = mapped_column(BigInteger,
                                                                        nullable=True)
    updated_at: Mapped[int] = mapped_column(BigInteger, default=now)


class DataLocation(Base):
    """An object-store location (a URI prefix) a project's batches may read datasets
    from or write outputs to, in place (jobs/batches/datasets.py); set by an admin.
    ``access``: read, write or read_write."""

    __tablename__ = "data_locations"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    uri: Mapped[str] = mapped_column(String(1024))
    access: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)

    __table_args__ = (Index("ix_data_locations_tenant_id_uri", "tenant_id", "uri",
                            unique=True),)


class OutputReservation(Base):
    """The output dataset prefix a batch writes (``uri``, ending in ``/``; a file:// one
    by its real path), held from its creation until it ends
    (jobs/batches/output_reservations.py): no two batches that have not ended hold the
    same prefix, nor one inside the other. The row of a batch that has ended holds
    nothing (and is dropped by the next reservation)."""

    __tablename__ = "output_reservations"
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"),
                                          primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    uri: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)

    __table_args__ = (Index("ix_output_reservations_uri", "uri"),)
