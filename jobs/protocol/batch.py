"""The body that creates a batch (``BatchCreate``): its input (an uploaded file, or a
dataset in place), where it may also write its results, its request defaults; and when
a File expires (``ExpiresAfter``: a file's, an upload's, a batch's output files)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from jobs.protocol.endpoints import ENDPOINTS
from jobs.protocol.parsing import supported
from jobs.protocol.validation import Name, check_metadata, one_of

MIN_FILE_EXPIRY_S, MAX_FILE_EXPIRY_S = 3600, 30 * 86400  # as OpenAI's files


class ExpiresAfter(BaseModel):
    """When a File expires: ``seconds`` after its ``created_at`` (files, uploads, and
    a batch's output and error files)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_FILE_EXPIRY_S, le=MAX_FILE_EXPIRY_S)


URI = Annotated[str, Field(strict=True, min_length=1, max_length=512)]
Column = Annotated[str, Field(strict=True, min_length=1, max_length=256)]


class DatasetInput(BaseModel):
    """inferq extension: a batch over a dataset where it is (jobs/batches/datasets.py):
    the objects ``uri`` names (one object, a prefix, a glob), Parquet or JSONL rows.
    Each row is one request: ``id_column`` its custom_id, and its input the
    ``input_column`` or the ``template`` over columns (``"{title}: {body}"``);
    ``system``, a system prompt (chat and responses)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    uri: URI
    format: Literal["parquet", "jsonl"] | None = None
    id_column: Column = "custom_id"
    input_column: Column | None = None
    template: Annotated[str, Field(strict=True, min_length=1, max_length=65536)] | None = None
    system: Annotated[str, Field(strict=True, max_length=65536)] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> DatasetInput:
        if self.template is not None and self.input_column is not None:
            raise ValueError("give input_column or template, not both")
        return self


class DatasetOutput(BaseModel):
    """inferq extension: where a batch also writes its results as a Parquet dataset
    (one part per shard, a manifest, then ``_SUCCESS``)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    uri: URI


class BatchCreate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    # One of the two: an uploaded file, or (inferq extension) a dataset in place.
    input_file_id: Name | None = None
    input_dataset: DatasetInput | None = None
    output_dataset: DatasetOutput | None = None
    endpoint: Annotated[Name, one_of("endpoint", ENDPOINTS)]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    service_tier: Literal["default", "flex", "auto"] = "default"
    # inferq extension: request defaults, under each request's own fields (JSONL) or
    # beside a dataset's input column (Parquet), e.g. {"model": ...}.
    body: dict[str, Any] = Field(default_factory=dict)
    # inferq extension: where the batch's terminal event is also sent (jobs/webhooks/events.py).
    callback_url: str | None = Field(default=None, max_length=2048)
    # Its output and error files expire this long after they are made.
    output_expires_after: ExpiresAfter | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(v)

    @model_validator(mode="after")
    def _defaults(self) -> BatchCreate:
        """Defaults a request could not take are refused with the batch, not once per
        line: parameters the endpoint does not implement, or does not know."""
        supported(self.endpoint, self.body, prefix="body.")
        if (self.input_file_id is None) == (self.input_dataset is None):
            raise ValueError("give input_file_id (an uploaded file) or input_dataset (a "
                             "dataset in the object store), one of the two")
        if self.output_dataset is not None and self.input_dataset is None:
            raise ValueError("output_dataset is for a batch over an input_dataset")
        return self
