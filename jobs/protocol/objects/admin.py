"""The Admin API's objects (api/routes/admin.py, api/routes/usage.py): projects, service
accounts and their keys, rate limits, data locations (each built from its row), and
usage and costs in time buckets (built by jobs.tenants.usage)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, Literal, Protocol, Self, cast

from jobs.core import access_tables as rows
from jobs.core.schema import Tenant
from jobs.protocol.objects.common import Out, T

Access = Literal["read", "write", "read_write"]


# What jobs.tenants.projects hands over (this layer does not import it) ---------------------


class KeyMade(Protocol):
    """A key just created (``NewKey``): its row and its value, shown this once."""

    @property
    def key(self) -> rows.ApiKey: ...
    @property
    def value(self) -> str: ...


class KeyShown(Protocol):
    """A live key (``KeyView``): its row, its owner, whether it authenticates now."""

    @property
    def key(self) -> rows.ApiKey: ...
    @property
    def owner(self) -> rows.ServiceAccount | None: ...
    @property
    def active(self) -> bool: ...


class Limits(Protocol):
    """A model's effective limits for a project (``LimitView``): None is no limit of
    that kind."""

    @property
    def id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def values(self) -> Mapping[str, int | None]: ...


# The objects ---------------------------------------------------------------------------------


class Project(Out):
    id: str
    object: Literal["organization.project"] = "organization.project"
    name: str
    created_at: int
    archived_at: int | None
    status: Literal["active", "archived"]
    external_key_id: None
    residency: None
    weight: int

    @classmethod
    def of(cls, t: Tenant) -> Self:
        return cls(id=t.id, name=t.name, created_at=t.created_at, archived_at=t.archived_at,
                   status="archived" if t.archived_at is not None else "active",
                   external_key_id=None, residency=None, weight=t.weight)


class ServiceAccount(Out):
    id: str
    object: Literal["organization.project.service_account"] = (
        "organization.project.service_account")
    name: str
    role: str
    created_at: int

    @classmethod
    def of(cls, sa: rows.ServiceAccount) -> Self:
        return cls(id=sa.id, name=sa.name, role=sa.role, created_at=sa.created_at)


class NewKey(Out):
    """A key as created: its value is shown this once."""

    id: str
    object: Literal["organization.project.service_account.api_key"] = (
        "organization.project.service_account.api_key")
    name: str | None
    created_at: int
    value: str
    expires_at: int | None

    @classmethod
    def of(cls, k: KeyMade) -> Self:
        return cls(id=k.key.id, name=k.key.name, created_at=k.key.created_at, value=k.value,
                   expires_at=k.key.expires_at)


class ServiceAccountCreated(ServiceAccount):
    api_key: NewKey | None

    @classmethod
    def of(cls, sa: rows.ServiceAccount, api_key: NewKey | None = None) -> Self:
        """``api_key``: its first key (None when made without one)."""
        return cls(id=sa.id, name=sa.name, role=sa.role, created_at=sa.created_at,
                   api_key=api_key)


class KeyOwnerAccount(Out):
    id: str
    name: str
    created_at: int
    role: str


class KeyOwner(Out):
    type: Literal["service_account"] | None
    service_account: KeyOwnerAccount | None
    user: None

    @classmethod
    def of(cls, sa: rows.ServiceAccount | None) -> Self:
        if sa is None:
            return cls(type=None, service_account=None, user=None)
        return cls(type="service_account", user=None, service_account=KeyOwnerAccount(
            id=sa.id, name=sa.name, created_at=sa.created_at, role=sa.role))


class ApiKey(Out):
    id: str
    object: Literal["organization.project.api_key"] = "organization.project.api_key"
    name: str | None
    redacted_value: str
    created_at: int
    last_used_at: int | None
    expires_at: int | None
    owner: KeyOwner
    owner_project_access: Literal["active", "inactive"]

    @classmethod
    def of(cls, v: KeyShown) -> Self:
        k = v.key
        return cls(id=k.id, name=k.name, redacted_value=f"{k.prefix}...{k.suffix}",
                   created_at=k.created_at, last_used_at=k.last_used_at,
                   expires_at=k.expires_at, owner=KeyOwner.of(v.owner),
                   owner_project_access="active" if v.active else "inactive")


class RateLimit(Out):
    id: str
    object: Literal["project.rate_limit"] = "project.rate_limit"
    model: str
    max_requests_per_1_minute: int
    max_tokens_per_1_minute: int
    max_requests_per_1_day: int | None
    batch_1_day_max_input_tokens: int | None
    max_concurrent_streams: int | None

    @classmethod
    def of(cls, v: Limits, unlimited: int) -> Self:
        """The effective limits (the project's over the deployment's defaults).
        ``max_requests_per_1_minute`` and ``max_tokens_per_1_minute`` are required
        integers in OpenAI's shape: no limit is reported as ``unlimited``
        (INFERQ_RATE_LIMIT_UNLIMITED); the other kinds as null."""
        values = v.values
        return cls(id=v.id, model=v.model,
                   max_requests_per_1_minute=values["max_requests_per_1_minute"] or unlimited,
                   max_tokens_per_1_minute=values["max_tokens_per_1_minute"] or unlimited,
                   max_requests_per_1_day=values["max_requests_per_1_day"],
                   batch_1_day_max_input_tokens=values["batch_1_day_max_input_tokens"],
                   max_concurrent_streams=values["max_concurrent_streams"])


class DataLocation(Out):
    id: str
    object: Literal["organization.project.data_location"] = (
        "organization.project.data_location")
    uri: str
    access: Access
    created_at: int

    @classmethod
    def of(cls, row: rows.DataLocation) -> Self:
        return cls(id=row.id, uri=row.uri, access=cast(Access, row.access),
                   created_at=row.created_at)


class _TokenUsage(Out):
    """A usage bucket's result: the tokens and requests of a group."""

    object: str
    input_tokens: int
    num_model_requests: int
    project_id: str | None
    user_id: None
    api_key_id: str | None
    model: str | None


class CompletionsUsage(_TokenUsage):
    object: Literal["organization.usage.completions.result"] = (
        "organization.usage.completions.result")
    output_tokens: int
    input_cached_tokens: int
    input_audio_tokens: int
    output_audio_tokens: int
    batch: bool | None
    service_tier: str | None
    api_source: str | None


class EmbeddingsUsage(_TokenUsage):
    object: Literal["organization.usage.embeddings.result"] = (
        "organization.usage.embeddings.result")


class Amount(Out):
    value: float
    currency: Literal["usd"] = "usd"


class CostsResult(Out):
    object: Literal["organization.costs.result"] = "organization.costs.result"
    amount: Amount
    line_item: str | None
    project_id: str | None
    api_key_id: str | None
    user_id: None
    api_source: str | None
    quantity: float | None
    quantity_unit: str | None


class Bucket(Out, Generic[T]):
    object: Literal["bucket"] = "bucket"
    start_time: int
    end_time: int
    results: list[T]


class UsagePage(Out, Generic[T]):
    """One page of time buckets (``page`` = ``next_page`` for the next one)."""

    object: Literal["page"] = "page"
    data: list[Bucket[T]]
    has_more: bool
    next_page: str | None
