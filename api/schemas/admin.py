"""The Admin API's objects (api/routes/admin.py, api/routes/usage.py): projects, service
accounts and their keys, rate limits, data locations, and usage and costs in time
buckets."""

from __future__ import annotations

from typing import Generic, Literal

from api.schemas.common import Out, T


class Project(Out):
    id: str
    object: Literal["organization.project"]
    name: str
    created_at: int
    archived_at: int | None
    status: Literal["active", "archived"]
    external_key_id: None
    residency: None
    weight: int


class ServiceAccount(Out):
    id: str
    object: Literal["organization.project.service_account"]
    name: str
    role: str
    created_at: int


class NewKey(Out):
    """A key as created: its value is shown this once."""

    id: str
    object: Literal["organization.project.service_account.api_key"]
    name: str | None
    created_at: int
    value: str
    expires_at: int | None


class ServiceAccountCreated(ServiceAccount):
    api_key: NewKey | None


class KeyOwnerAccount(Out):
    id: str
    name: str
    created_at: int
    role: str


class KeyOwner(Out):
    type: Literal["service_account"] | None
    service_account: KeyOwnerAccount | None
    user: None


class ApiKey(Out):
    id: str
    object: Literal["organization.project.api_key"]
    name: str | None
    redacted_value: str
    created_at: int
    last_used_at: int | None
    expires_at: int | None
    owner: KeyOwner
    owner_project_access: Literal["active", "inactive"]


class RateLimit(Out):
    id: str
    object: Literal["project.rate_limit"]
    model: str
    max_requests_per_1_minute: int
    max_tokens_per_1_minute: int
    max_requests_per_1_day: int | None
    batch_1_day_max_input_tokens: int | None
    max_concurrent_streams: int | None


class DataLocation(Out):
    id: str
    object: Literal["organization.project.data_location"]
    uri: str
    access: Literal["read", "write", "read_write"]
    created_at: int


class CompletionsUsage(Out):
    object: Literal["organization.usage.completions.result"]
    input_tokens: int
    output_tokens: int
    input_cached_tokens: int
    input_audio_tokens: int
    output_audio_tokens: int
    num_model_requests: int
    project_id: str | None
    user_id: None
    api_key_id: str | None
    model: str | None
    batch: bool | None
    service_tier: str | None
    api_source: str | None


class EmbeddingsUsage(Out):
    object: Literal["organization.usage.embeddings.result"]
    input_tokens: int
    num_model_requests: int
    project_id: str | None
    user_id: None
    api_key_id: str | None
    model: str | None


class Amount(Out):
    value: float
    currency: Literal["usd"]


class CostsResult(Out):
    object: Literal["organization.costs.result"]
    amount: Amount
    line_item: str | None
    project_id: str | None
    api_key_id: str | None
    user_id: None
    api_source: str | None
    quantity: float | None
    quantity_unit: str | None


class Bucket(Out, Generic[T]):
    object: Literal["bucket"]
    start_time: int
    end_time: int
    results: list[T]


class UsagePage(Out, Generic[T]):
    """One page of time buckets (``page`` = ``next_page`` for the next one)."""

    object: Literal["page"]
    data: list[Bucket[T]]
    has_more: bool
    next_page: str | None
