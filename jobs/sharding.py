"""Validate a batch input file and cut it into Parquet shards in one streamed pass.

Every line is parsed once. Whole-file problems (bad JSON, duplicate or missing
custom_id, wrong url or method, unknown or mixed models, bad encoding, a line
over the size limit) are collected with line numbers and fail the batch.
Per-request problems (the body does not match the endpoint's schema) become
error-file lines and the rest of the batch runs.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from jobs.errors import InvalidRequest
from jobs.requests import EMBEDDINGS, MODELS, parse_embeddings, parse_generation, text_length
from storage import keys
from storage.objects import ObjectStore, buffered
from storage.parquet import dataset_columns, iter_dataset, shard_bytes

MAX_REPORTED_ERRORS = 100
INPUT_COLUMNS = ("input", "prompt", "messages")


@dataclass
class ShardPlan:
    """What validation produced: shard objects written, counts, and errors."""

    shards: list[int] = field(default_factory=list)  # rows per shard, by index
    total: int = 0
    invalid: int = 0
    model: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0

    def fail(self, code: str, message: str, line: int | None, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})


class _Sharder:
    def __init__(self, store: ObjectStore, batch_id: str, endpoint: str, shard_rows: int,
                 max_inputs: int, max_requests: int) -> None:
        self.store, self.batch_id, self.endpoint = store, batch_id, endpoint
        self.shard_rows, self.max_inputs, self.max_requests = shard_rows, max_inputs, max_requests
        self.plan = ShardPlan()
        self.rows: list[tuple[int, str, str, int]] = []
        self.seen: set[bytes] = set()
        self.invalid_lines: list[bytes] = []
        self.single_input = False  # Parquet datasets: one text per row

    def add(self, line_no: int, custom_id: Any, body: Any) -> None:
        """Check one request; queue it for a shard or record why not."""
        plan = self.plan
        if not isinstance(custom_id, str) or not custom_id:
            return plan.fail("missing_custom_id", "custom_id must be a non-empty string", line_no,
                             "custom_id")
        digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
        if digest in self.seen:
            return plan.fail("duplicate_custom_id", f"custom_id {custom_id!r} appears more "
                             "than once", line_no, "custom_id")
        self.seen.add(digest)
        if not isinstance(body, dict):
            return plan.fail("invalid_body", "body must be a JSON object", line_no, "body")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return plan.fail("missing_model", "body.model is required", line_no, "body.model")
        if model not in MODELS:
            return plan.fail("model_not_found", f"The model '{model}' does not exist", line_no,
                             "body.model")
        if (MODELS[model] == "embeddings") != (self.endpoint == EMBEDDINGS):
            return plan.fail("model_not_found", f"The model '{model}' does not serve "
                             f"{self.endpoint}", line_no, "body.model")
        if plan.model is None:
            plan.model = model
        elif model != plan.model:
            return plan.fail("mismatched_model", f"all requests in a batch must use one model "
                             f"(line uses {model!r}, first line {plan.model!r})", line_no,
                             "body.model")
        plan.total += 1
        if plan.total > self.max_requests:
            if plan.total == self.max_requests + 1:
                plan.fail("too_many_requests", f"a batch holds at most {self.max_requests} "
                          "requests", line_no)
            return None
        try:
            if self.endpoint == EMBEDDINGS:
                parse_embeddings(body, self.max_inputs)
            elif parse_generation(self.endpoint, body).stream:
                raise InvalidRequest("stream is not available in a batch", param="stream")
            single = self.single_input and self.endpoint == EMBEDDINGS
            if single and not isinstance(body.get("input"), str):
                raise InvalidRequest("a dataset row holds one text: the input cell must be a "
                                     "non-empty string", param="input")
        except InvalidRequest as e:
            plan.invalid += 1
            self.invalid_lines.append(error_line(custom_id, 400, e.message, e.code or
                                                 "invalid_request", e.param))
            return None
        self.rows.append((line_no, custom_id, orjson.dumps(body).decode(), text_length(body)))
        if len(self.rows) >= self.shard_rows:
            self.flush()
        return None

    def flush(self) -> None:
        if not self.rows or self.plan.error_count:
            self.rows = []
            return
        index = len(self.plan.shards)
        self.store.put_bytes(keys.shard_input(self.batch_id, index), shard_bytes(self.rows))
        self.plan.shards.append(len(self.rows))
        self.rows = []

    def finish(self) -> ShardPlan:
        if self.plan.total == 0 and not self.plan.error_count and not self.plan.invalid:
            self.plan.fail("empty_file", "the input file has no requests", None)
        self.flush()
        if self.plan.error_count:
            self.store.delete_prefix(keys.batch_prefix(self.batch_id))
            self.plan.shards = []
        elif self.invalid_lines:
            self.store.put_bytes(keys.validation_errors(self.batch_id),
                                 b"".join(self.invalid_lines))
        return self.plan


def error_line(custom_id: str, status: int, message: str, code: str,
               param: str | None = None) -> bytes:
    """An error-file line for a request that got an HTTP error response."""
    from jobs.models import new_id

    return orjson.dumps({
        "id": new_id("batch_req_"), "custom_id": custom_id,
        "response": {"status_code": status, "request_id": new_id("req_"),
                     "body": {"error": {"message": message, "type": "invalid_request_error",
                                        "param": param, "code": code}}},
        "error": None,
    }) + b"\n"


def _lines(stream: IO[bytes], max_line: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) pairs; ``None`` for a line over ``max_line`` (skipped unread)."""
    reader = buffered(stream)
    n = 0
    while True:
        line = reader.readline(max_line + 1)
        if not line:
            return
        n += 1
        if len(line) > max_line and not line.endswith(b"\n"):
            while (rest := reader.readline(1024 * 1024)) and not rest.endswith(b"\n"):
                pass
            yield n, None
            continue
        yield n, line


def shard_jsonl(s: _Sharder, stream: IO[bytes], max_line: int) -> None:
    for n, raw in _lines(stream, max_line):
        if raw is None:
            s.plan.fail("line_too_long", f"line is longer than {max_line} bytes", n)
            continue
        if not raw.strip():
            continue
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte-order mark, as some editors write
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            s.plan.fail("invalid_encoding", "line is not valid UTF-8", n)
            continue
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            s.plan.fail("invalid_json_line", f"line is not valid JSON: {e}", n)
            continue
        if not isinstance(obj, dict):
            s.plan.fail("invalid_json_line", "line must be a JSON object", n)
            continue
        if obj.get("method", "POST") != "POST":
            s.plan.fail("invalid_method", "method must be POST", n, "method")
            continue
        if obj.get("url") != s.endpoint:
            s.plan.fail("invalid_url", f"url must be {s.endpoint} (the batch's endpoint), got "
                        f"{obj.get('url')!r}", n, "url")
            continue
        s.add(n, obj.get("custom_id"), obj.get("body"))


def shard_parquet(s: _Sharder, path: Path, defaults: dict[str, Any]) -> None:
    cols = dataset_columns(path)
    column = next((c for c in INPUT_COLUMNS if c in cols), None)
    if "custom_id" not in cols or column is None:
        s.plan.fail("invalid_dataset", "a Parquet input needs a custom_id column and one of "
                    f"{', '.join(INPUT_COLUMNS)} (columns: {', '.join(cols)})", None)
        return
    n = 0
    s.single_input = True
    for rows in iter_dataset(path):
        for row in rows:
            n += 1
            s.add(n, row["custom_id"], {**defaults, column: row[column]})


def validate_and_shard(store: ObjectStore, *, batch_id: str, file_key: str, file_format: str,
                       endpoint: str, defaults: dict[str, Any], shard_rows: int, max_line: int,
                       max_inputs: int, max_requests: int) -> ShardPlan:
    s = _Sharder(store, batch_id, endpoint, shard_rows, max_inputs, max_requests)
    if file_format == "parquet":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "input.parquet"
            store.download(file_key, path)
            try:
                shard_parquet(s, path, defaults)
            except (OSError, ValueError) as e:  # pyarrow's errors derive from these
                s.plan.fail("invalid_dataset", f"the Parquet file cannot be read: {e}", None)
    else:
        with store.open(file_key) as stream:
            shard_jsonl(s, stream, max_line)
    return s.finish()
