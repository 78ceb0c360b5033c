"""Response shapes (OpenAI objects with every field present), their pydantic models
(what /openapi.json says each route returns) and request parsing helpers."""

from __future__ import annotations

import re
from typing import Any, Generic, Literal, TypeVar

import orjson
from flask import request
from pydantic import BaseModel, ConfigDict, Field

from jobs.batches.queries import ShardSums
from jobs.batches.uploads import status_of
from jobs.core.errors import InvalidRequest, NotFound, PayloadTooLarge, shown
from jobs.core.schema import Batch, File, Upload, UploadPart
from jobs.core.status import BatchStatus, DeliveryStatus, JobStatus

MAX_JSON_DEPTH = 64
# Every id this service hands out (and every model name) fits this; anything else
# cannot name an object, and must not reach the database (PostgreSQL refuses NUL).
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_MISSING = {"file_id": "No such File object: {}", "batch_id": "No such Batch object: {}",
            "job_id": "No such job: {}", "model_id": "The model {} does not exist",
            "upload_id": "No such Upload object: {}"}


MAX_JSON_BODY = 64 * 1024 * 1024  # bytes of any request body but an upload's


def optional_json_body() -> dict[str, Any]:
    """A JSON body where every field is optional: none at all is ``{}``."""
    return json_body() if request.get_data(cache=True) else {}


def json_body(limit: int = MAX_JSON_BODY) -> dict[str, Any]:
    """The request's JSON object: valid UTF-8, at most ``MAX_JSON_DEPTH`` levels deep,
    no NUL character in any string (the database cannot store one)."""
    if (request.content_length or 0) > limit:
        raise PayloadTooLarge(f"a JSON request body is at most {limit} bytes")
    if not request.is_json:
        raise InvalidRequest("the request body must be JSON, sent with "
                             "Content-Type: application/json")
    raw = request.get_data(cache=True)
    if len(raw) > limit:  # a chunked body has no Content-Length to refuse it by
        raise PayloadTooLarge(f"a JSON request body is at most {limit} bytes")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if _NUL_ESCAPE.search(raw):
        raise InvalidRequest("strings in the request body must not contain NUL (\\u0000)")
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(body):
        raise InvalidRequest(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    return body


def _too_deep(body: Any) -> bool:
    level = [body]
    for _ in range(MAX_JSON_DEPTH):
        deeper: list[Any] = []
        for v in level:
            for c in v.values() if isinstance(v, dict) else v:
                if isinstance(c, dict | list):
                    deeper.append(c)
        if not deeper:
            return False
        level = deeper
    return True


def check_path_ids(view_args: dict[str, Any]) -> None:
    """An id in a path that no object can have is a 404 before any lookup."""
    for name, value in view_args.items():
        if name in _MISSING and not ID.fullmatch(value):
            raise NotFound(_MISSING[name].format(shown(value)), param=name,
                           code="model_not_found" if name == "model_id" else None)


def query_text(name: str, max_len: int = 64) -> str | None:
    """A free-text query parameter, refused if it could not be stored or compared."""
    v = request.args.get(name)
    if v is not None and (len(v) > max_len or not v.isprintable()):
        raise InvalidRequest(f"{name} must be at most {max_len} printable characters",
                             param=name)
    return v


def page_params() -> tuple[str | None, int]:
    raw = request.args.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidRequest(f"limit must be an integer, got {shown(raw)}",
                             param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    after = request.args.get("after") or None
    if after is not None and (len(after) > 64 or not ID.fullmatch(after)):
        raise InvalidRequest(f"after must be an object id, got {shown(after)}", param="after")
    return after, limit


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


def file_object(f: File) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": f.expires_at, "status_details": None}


def upload_object(up: Upload, f: File | None) -> dict[str, Any]:
    """The OpenAI upload object; ``file`` is the File it made (once completed)."""
    return {"id": up.id, "object": "upload", "bytes": up.bytes, "created_at": up.created_at,
            "expires_at": up.expires_at, "filename": up.filename, "purpose": up.purpose,
            "status": status_of(up).value, "file": file_object(f) if f is not None else None}


def upload_part_object(p: UploadPart) -> dict[str, Any]:
    return {"id": p.id, "object": "upload.part", "created_at": p.created_at,
            "upload_id": p.upload_id}


def batch_object(b: Batch, sums: ShardSums) -> dict[str, Any]:
    """The OpenAI batch object; ``sums`` are its shards' (all zero before it has
    shards). ``usage`` is the sum of the usage of its output lines."""
    completed, failed, input_tokens, output_tokens = sums
    out: dict[str, Any] = {
        "id": b.id, "object": "batch", "endpoint": b.endpoint,
        "errors": {"object": "list", "data": b.errors} if b.errors else None,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window,
        "status": b.status, "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
        "created_at": b.created_at, "in_progress_at": b.in_progress_at,
        "expires_at": b.expires_at, "finalizing_at": b.finalizing_at,
        "completed_at": b.completed_at, "failed_at": b.failed_at, "expired_at": b.expired_at,
        "cancelling_at": b.cancelling_at, "cancelled_at": b.cancelled_at,
        "request_counts": {"total": b.total, "completed": completed,
                           "failed": failed + b.invalid},
        "metadata": b.metadata_, "model": b.model, "model_version": b.model_version,
        "service_tier": b.service_tier, "parent_batch_id": b.parent_batch_id,
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output_tokens,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
    }
    return out


# Response models: the shapes the builders above (and the other routes' builders) return,
# described for /openapi.json. Every field is required (OpenAI objects are sent whole);
# nothing else is sent.

T = TypeVar("T")


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorObject(Out):
    message: str
    type: str
    param: str | None
    code: str | None


class Error(Out):
    """Every error response: the OpenAI error shape."""

    error: ErrorObject


class Page(Out, Generic[T]):
    """A cursor page (``after`` = ``last_id`` for the next one)."""

    object: Literal["list"]
    data: list[T]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Deleted(Out):
    id: str
    object: str
    deleted: bool


class FileObject(Out):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"]
    expires_at: int | None
    status_details: str | None


class FileUpload(BaseModel):
    """The multipart form of ``POST /v1/files`` (``expires_after`` as the SDK sends it:
    two fields)."""

    file: bytes
    purpose: Literal["batch"]
    expires_after_anchor: Literal["created_at"] | None = Field(
        default=None, alias="expires_after[anchor]")
    expires_after_seconds: int | None = Field(default=None, alias="expires_after[seconds]",
                                              ge=3600, le=30 * 86400)


class UploadObject(Out):
    id: str
    object: Literal["upload"]
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None


class UploadPartObject(Out):
    id: str
    object: Literal["upload.part"]
    created_at: int
    upload_id: str


class PartUpload(BaseModel):
    """The multipart form of ``POST /v1/uploads/{upload_id}/parts``."""

    data: bytes


class BatchError(BaseModel):
    code: str | None
    line: int | None
    message: str | None
    param: str | None


class BatchErrors(Out):
    object: Literal["list"]
    data: list[BatchError]


class RequestCounts(Out):
    total: int
    completed: int
    failed: int


class CachedTokens(Out):
    cached_tokens: int


class ReasoningTokens(Out):
    reasoning_tokens: int


class BatchUsage(Out):
    input_tokens: int
    input_tokens_details: CachedTokens
    output_tokens: int
    output_tokens_details: ReasoningTokens
    total_tokens: int


class BatchObject(Out):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    model: str | None
    model_version: str | None  # the version pinned when the batch was validated
    service_tier: str
    parent_batch_id: str | None  # the batch whose failed requests this one reruns
    usage: BatchUsage


class JobObject(Out):
    id: str
    object: Literal["job"]
    endpoint: str
    status: JobStatus
    created_at: int
    started_at: int | None
    completed_at: int | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    callback_url: str | None
    attempts: int
    model_version: str | None  # the version it was routed to (a canary's, or the default)


class VersionResidency(Out):
    version: str
    precision: str
    engine: str
    traffic_weight: float
    resident_on: list[str]
    engines_in_use: list[str]


class ModelObject(Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    version: str
    kind: str
    precision: str
    engine: str
    context_length: int | None
    tools: bool | None
    matryoshka: bool
    resident_on: list[str]
    engines_in_use: list[str]
    versions: list[VersionResidency]


class RolloutVersion(Out):
    version: str
    default: bool
    precision: str
    engine: str
    traffic_weight: float
    shadow_share: float
    min_resident: int
    idle_unload_s: int | None
    resident_on: list[str]
    loads: dict[str, int]


class ShadowRow(Out):
    version: str
    primary: int
    shadow: int
    errors: int
    compared: int
    agreement: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None


class Rollout(Out):
    object: Literal["model.rollout"]
    name: str
    versions: list[RolloutVersion]
    shadow: list[ShadowRow]


class RolloutList(Out):
    object: Literal["list"]
    data: list[Rollout]


class ModelList(Out):
    object: Literal["list"]
    data: list[ModelObject]


class Embedding(Out):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Out):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Out):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class CompletionUsage(Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatMessage(Out):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None


class ChatChoice(Out):
    index: int
    message: ChatMessage
    finish_reason: str
    logprobs: None


class ChatCompletion(Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
    system_fingerprint: str | None


class CompletionChoice(Out):
    index: int
    text: str
    finish_reason: str
    logprobs: None


class Completion(Out):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    system_fingerprint: str | None


class ResponseInputTokens(Out):
    cached_tokens: int
    cache_write_tokens: int


class ResponseUsage(Out):
    input_tokens: int
    input_tokens_details: ResponseInputTokens
    output_tokens: int
    output_tokens_details: ReasoningTokens
    total_tokens: int


class OutputText(Out):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]]
    logprobs: list[dict[str, Any]]


class OutputMessage(Out):
    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class IncompleteDetails(Out):
    reason: Literal["max_output_tokens"]


class ResponseReasoning(Out):
    effort: None
    summary: None


class ResponseTextFormat(Out):
    type: Literal["text"]


class ResponseText(Out):
    format: ResponseTextFormat
    verbosity: None


class ResponseObject(Out):
    """A Response (/v1/responses; jobs.protocol.responses)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    background: bool
    completed_at: int | None
    error: None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: None
    metadata: dict[str, str]
    model: str
    output: list[OutputMessage]
    parallel_tool_calls: bool
    previous_response_id: None
    prompt: None
    prompt_cache_key: None
    prompt_cache_retention: None
    reasoning: ResponseReasoning
    safety_identifier: None
    service_tier: Literal["default"]
    store: bool
    temperature: float
    text: ResponseText
    tool_choice: Literal["none"]
    tools: list[dict[str, Any]]
    top_logprobs: int
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None


class WebhookEndpoint(Out):
    id: str
    object: Literal["webhook_endpoint"]
    created_at: int
    updated_at: int
    name: str
    url: str
    event_types: list[str]
    signing_secret_hint: str


class WebhookEndpointWithSecret(WebhookEndpoint):
    """As created or rotated: the signing secret is shown this once."""

    signing_secret: str


class WebhookTestResult(Out):
    object: Literal["webhook_endpoint.test"]
    webhook_endpoint_id: str
    event_type: str
    status_code: int
    success: bool


class EventTypeList(Out):
    object: Literal["list"]
    data: list[str]


class DeliveryAttempt(Out):
    attempt: int
    started_at: int
    duration_ms: int | None
    status_code: int | None
    error: str | None


class Delivery(Out):
    id: str
    object: Literal["webhook_endpoint.delivery"]
    event_id: str
    event_type: str
    webhook_endpoint_id: str
    status: DeliveryStatus
    created_at: int
    delivered_at: int | None
    next_attempt_at: int | None
    attempts: list[DeliveryAttempt]


class CallbackSecret(Out):
    object: Literal["webhook_callback_secret"]
    created_at: int
    updated_at: int
    signing_secret_hint: str


class CallbackSecretWithSecret(CallbackSecret):
    signing_secret: str


class HealthChecks(Out):
    database: str
    redis: str
    workers: int
    lanes: dict[str, int]
    models: dict[str, list[str]]


class Health(Out):
    """``status`` "ok" with 200; "unavailable" with 503."""

    status: Literal["ok", "unavailable"]
    checks: HealthChecks


class Liveness(Out):
    status: Literal["ok"]


# The Admin API (api/routes/admin.py, api/routes/usage.py) -----------------------------------------


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
