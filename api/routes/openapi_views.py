"""What /openapi.json says of each view that its URL map cannot tell: the model its
JSON (or multipart) body is parsed with, the model of its 200 answer or its other media
types, its streams and headers, its query and header parameters, who may call it, the
error statuses it adds, and whether it takes an ``Idempotency-Key``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from api.routes import admin, fleet
from jobs.asyncjobs.lifecycle import JobCreate
from jobs.batches import partial
from jobs.batches.retry import BatchRetry
from jobs.batches.uploads import UploadComplete, UploadCreate
from jobs.core.lanes import MODEL_LANES
from jobs.protocol.batch import BatchCreate
from jobs.protocol.embeddings import EmbeddingsBody
from jobs.protocol.generation import ChatBody, CompletionBody
from jobs.protocol.objects.admin import (
    ApiKey,
    CompletionsUsage,
    CostsResult,
    DataLocation,
    EmbeddingsUsage,
    NewKey,
    Project,
    RateLimit,
    ServiceAccount,
    ServiceAccountCreated,
    UsagePage,
)
from jobs.protocol.objects.batches import BatchObject
from jobs.protocol.objects.common import Deleted, Page
from jobs.protocol.objects.files import (
    FileObject,
    FileUpload,
    PartUpload,
    UploadObject,
    UploadPartObject,
)
from jobs.protocol.objects.fleet import (
    Health,
    Liveness,
    ModelList,
    ModelObject,
    Rollout,
    RolloutList,
)
from jobs.protocol.objects.inference import (
    ChatCompletion,
    Completion,
    EmbeddingsResponse,
    ResponseObject,
)
from jobs.protocol.objects.jobs import JobObject
from jobs.protocol.objects.webhooks import (
    CallbackSecret,
    CallbackSecretWithSecret,
    Delivery,
    EventTypeList,
    WebhookEndpoint,
    WebhookEndpointWithSecret,
    WebhookTestResult,
)
from jobs.protocol.responses_request import ResponsesBody
from jobs.tenants import projects as tenants
from jobs.tenants import usage
from jobs.webhooks.endpoints import EndpointCreate, EndpointUpdate, RotateSecret, TestSend

# The view (endpoint name) -> the model its JSON body is parsed with.
BODIES: dict[str, type[BaseModel]] = {
    "batches.create": BatchCreate, "batches.retry_": BatchRetry, "uploads.create": UploadCreate,
    "uploads.complete": UploadComplete, "inference.embeddings": EmbeddingsBody,
    "inference.chat_completions": ChatBody, "inference.completions": CompletionBody,
    "inference.responses": ResponsesBody,
    "jobs.create": JobCreate, "webhooks.create": EndpointCreate,
    "webhooks.update": EndpointUpdate, "webhooks.rotate_secret": RotateSecret,
    "webhooks.test": TestSend, "webhooks.rotate_callback_secret": RotateSecret,
    "admin.create_project": admin.ProjectCreate, "admin.update_project": admin.ProjectUpdate,
    "admin.create_service_account": admin.ServiceAccountCreate,
    "admin.create_key": admin.KeyCreate, "admin.update_rate_limit": admin.RateLimitUpdate,
    "admin.create_location": admin.LocationCreate,
    "fleet.step": fleet.RolloutStep, "fleet.pool": fleet.PoolBody, "fleet.add": fleet.ModelAdd}
# Bodies that may be left out entirely (every field optional).
OPTIONAL_BODIES = {"batches.retry_", "webhooks.update", "webhooks.rotate_secret",
                   "webhooks.rotate_callback_secret",
                   "admin.update_project", "admin.create_key"}
UPLOADS: dict[str, type[BaseModel]] = {"files.create": FileUpload,
                                       "uploads.add_part": PartUpload}

# The view -> the model of its 200 JSON answer.
OK: dict[str, type[BaseModel]] = {
    "files.create": FileObject, "files.list_": Page[FileObject],
    "files.retrieve": FileObject, "files.delete": Deleted,
    "uploads.create": UploadObject, "uploads.add_part": UploadPartObject,
    "uploads.complete": UploadObject, "uploads.cancel": UploadObject,
    "batches.create": BatchObject, "batches.list_": Page[BatchObject],
    "batches.retrieve": BatchObject, "batches.cancel": BatchObject,
    "batches.retry_": BatchObject,
    "inference.embeddings": EmbeddingsResponse,
    "inference.chat_completions": ChatCompletion, "inference.completions": Completion,
    "inference.responses": ResponseObject,
    "jobs.create": JobObject, "jobs.retrieve": JobObject,
    "models.list_": ModelList, "models.retrieve": ModelObject,
    "webhooks.create": WebhookEndpointWithSecret,
    "webhooks.list_": Page[WebhookEndpoint], "webhooks.retrieve": WebhookEndpoint,
    "webhooks.update": WebhookEndpoint, "webhooks.delete": Deleted,
    "webhooks.rotate_secret": WebhookEndpointWithSecret,
    "webhooks.test": WebhookTestResult, "webhooks.event_types": EventTypeList,
    "webhooks.deliveries": Page[Delivery], "webhooks.resend": Delivery,
    "webhooks.callback_secret": CallbackSecret,
    "webhooks.rotate_callback_secret": CallbackSecretWithSecret,
    "health.healthz": Liveness, "health.readyz": Health,
    "admin.create_project": Project, "admin.list_projects": Page[Project],
    "admin.retrieve_project": Project, "admin.update_project": Project,
    "admin.archive_project": Project,
    "admin.create_service_account": ServiceAccountCreated,
    "admin.list_service_accounts": Page[ServiceAccount],
    "admin.retrieve_service_account": ServiceAccount,
    "admin.delete_service_account": Deleted, "admin.create_key": NewKey,
    "admin.list_keys": Page[ApiKey], "admin.retrieve_key": ApiKey,
    "admin.delete_key": Deleted, "admin.list_rate_limits": Page[RateLimit],
    "admin.update_rate_limit": RateLimit,
    "admin.create_location": DataLocation, "admin.list_locations": Page[DataLocation],
    "admin.delete_location": Deleted,
    "usage.completions": UsagePage[CompletionsUsage],
    "usage.embeddings": UsagePage[EmbeddingsUsage],
    "usage.costs": UsagePage[CostsResult],
    "fleet.list_": RolloutList, "fleet.get": Rollout, "fleet.step": Rollout,
    "fleet.pool": Rollout, "fleet.add": Rollout, "fleet.remove": Deleted}
TEXT = {"type": "string"}
# One Server-Sent Event (an event stream's schema describes each of its events).
SSE = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"},
    "data": {"type": "string", "description": "a JSON object (a stream of completion "
             "chunks ends with the data [DONE])"}}}
# The view -> its 200 answer that is not JSON (media type -> schema).
MEDIA: dict[str, dict[str, Any]] = {
    "files.content": {"application/jsonl": TEXT, "application/octet-stream": {
        "type": "string", "format": "binary"}},
    "batches.output": {"application/jsonl": TEXT},
    "batches.merged_output": {"application/jsonl": TEXT, "application/octet-stream": {
        "type": "string", "format": "binary"}},
    "batches.events": {"text/event-stream": SSE},
    "health.metrics": {"text/plain": TEXT},
    "openapi.openapi": {"application/json": {"type": "object"}},
    "openapi.docs": {"text/html": TEXT}}
STREAMS = {"inference.chat_completions", "inference.completions",  # stream: true → SSE
           "inference.responses"}
HEADERS = {  # the 200 answer's headers
    "batches.output": ("inferq-next-cursor", "inferq-batch-status", "inferq-chunks",
                       "inferq-complete"),
    "inference.embeddings": ("inferq-model-version", "inferq-queue-ms"),
    **{v: ("inferq-model-version",) for v in ("inference.chat_completions",
                                              "inference.completions",
                                              "inference.responses")}}

AUTHENTICATED = {"batches", "files", "inference", "jobs", "models", "uploads", "webhooks"}
ADMINISTERED = {"admin", "usage", "fleet"}
NO_BACKEND = {"openapi.openapi", "openapi.docs", "health.healthz"}  # the rest may answer 503
# Error statuses a view has beyond those its parameters imply (see openapi._errors).
ERRORS: dict[str, set[int]] = {
    "batches.create": {403, 404}, "batches.cancel": {409}, "uploads.cancel": {400},
    "batches.retry_": {409}, "batches.merged_output": {409},
    "files.delete": {409},
    "inference.embeddings": {413, 429, 504}, "inference.chat_completions": {413, 429, 504},
    "inference.completions": {413, 429, 504}, "inference.responses": {413, 429, 504},
    "jobs.create": {429},
    "webhooks.callback_secret": {404}, "health.metrics": {401, 403},
    "admin.create_project": {409}, "admin.update_project": {409},
    "admin.archive_project": {409}, "admin.create_service_account": {409},
    "admin.create_key": {409}, "admin.update_rate_limit": {409},
    "admin.create_location": {409},
    "fleet.add": {409}, "fleet.remove": {409}}
IDEMPOTENT = {"batches.create", "batches.retry_", "files.create", "jobs.create", "uploads.create",
              "uploads.add_part"}


def parameter(name: str, where: str, schema: dict[str, Any], required: bool = False,
              description: str | None = None) -> dict[str, Any]:
    out = {"name": name, "in": where, "required": required, "schema": schema}
    if description:
        out["description"] = description
    return out


def _int(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _names(**items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items or {"type": "string"}}


PAGE = [parameter("limit", "query", {**_int(1, 100), "default": 20}),
        parameter("after", "query", {"type": "string", "maxLength": 64},
                  description="the last id of the previous page")]


def _usage_params(what: str) -> list[dict[str, Any]]:
    widths = ["1d"] if what == "costs" else list(usage.WIDTHS)
    out = [parameter("start_time", "query", _int(0, usage.MAX_TIME), True, "Unix seconds"),
           parameter("end_time", "query", _int(0, usage.MAX_TIME)),
           parameter("bucket_width", "query", {"type": "string", "enum": widths, "default": "1d"}),
           parameter("limit", "query", _int(1, usage.COST_LIMITS[1] if what == "costs" else
                                            max(m for _, m in usage.BUCKET_LIMITS.values()))),
           parameter("page", "query", {"type": "string"}, description="next_page of a page"),
           parameter("group_by", "query", _names(type="string", enum=list(usage.GROUPS[what]))),
           parameter("project_ids", "query", _names()), parameter("api_key_ids", "query", _names())]
    if what == "costs":
        out.append(parameter("line_items", "query", _names()))
    else:
        out.append(parameter("models", "query", _names()))
    if what == usage.COMPLETIONS:
        out.append(parameter("batch", "query", {"type": "boolean"}))
    return out


# The view -> its query and header parameters.
PARAMS: dict[str, list[dict[str, Any]]] = {
    "files.list_": [*PAGE, parameter("purpose", "query", {"type": "string", "maxLength": 64})],
    "health.readyz": [parameter("lane", "query", _names(type="string", enum=list(MODEL_LANES)),
                                description="lanes that must have a live worker")],
    "batches.list_": PAGE, "webhooks.list_": PAGE, "webhooks.deliveries": PAGE,
    "admin.list_service_accounts": PAGE,
    "admin.list_projects": [*PAGE, parameter("include_archived", "query", {"type": "boolean"})],
    "admin.list_keys": [*PAGE, parameter("owner_project_access", "query", {
        "type": "string", "enum": list(tenants.OWNER_ACCESS), "default": "any"})],
    "admin.list_rate_limits": [*PAGE, parameter("before", "query", {"type": "string"})],
    "batches.output": [
        parameter("partial", "query", {"type": "string", "enum": ["true"]}, True,
                  "the lines committed so far (the final output is output_file_id's)"),
        parameter("after", "query", {"type": "string"},
                  description="the inferq-next-cursor header of the previous answer"),
        parameter("kind", "query", {"type": "string", "enum": list(partial.KINDS),
                                    "default": "output"})],
    "batches.events": [parameter("Last-Event-ID", "header", {"type": "string"},
                                 description="the id of the last event seen: resume after it")],
    "usage.completions": _usage_params(usage.COMPLETIONS),
    "usage.embeddings": _usage_params(usage.EMBEDDINGS_KIND),
    "usage.costs": _usage_params("costs")}
IDEMPOTENCY_KEY = parameter("Idempotency-Key", "header",
                            {"type": "string", "minLength": 1, "maxLength": 255},
                            description="a retry with the same key replays the first answer")

