"""Validate a batch input file and cut it into Parquet shards in one streamed pass.

Every line is parsed once. Whole-file problems (bad JSON, duplicate or missing
custom_id, wrong url or method, unknown or mixed models, bad encoding, a line
over the size limit) are collected with line numbers and fail the batch.
Per-request problems (the body does not match the endpoint's schema, or holds a
parameter inferq does not support: jobs.protocol.parsing.supported) become error-file lines
and the rest of the batch runs. The batch's ``body`` defaults are under every request,
JSONL line or Parquet row alike: a request's own fields win.

Client text quoted in a whole-file error (a custom_id, a url, a model name) goes
through ``shown``: escaped and cut short, since the errors are stored with the batch.
A shard holds each request's body as the schema read it (JSON text), whatever types
the input file used (a Parquet binary column reads as text).

The valid requests' prompt tokens (``ShardPlan.input_tokens``, what the project's
batch input tokens of the day are charged) are counted by ``count_tokens`` when the
caller has one: the control worker's counts with the model's tokenizer
(workers.models.token_count), the ``usage.prompt_tokens`` the output lines will
report. Without one, or for a request it cannot count, a request counts its upper
bound (jobs.tenants.token_counts.prompt_tokens: UTF-8 bytes plus the template's overheads).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from jobs.batches import outputs
from jobs.core.errors import MODEL_NOT_FOUND, InvalidRequest, shown
from jobs.core.refs import split_ref
from jobs.fleet.catalog import Catalog
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, text_length
from jobs.protocol.parsing import parse_embeddings, parse_generation, parse_responses
from jobs.protocol.responses_request import as_chat
from jobs.tenants.token_counts import prompt_tokens
from storage import keys
from storage.objects import ObjectStore, buffered
from storage.parquet import dataset_columns, iter_dataset, shard_bytes

MAX_REPORTED_ERRORS = 100
PUTS_IN_FLIGHT = 4
# The input column of a Parquet dataset, by endpoint.
DATASET_COLUMN = {EMBEDDINGS: "input", CHAT: "messages", COMPLETIONS: "prompt",
                  RESPONSES: "input"}
MAX_COLUMNS_SHOWN = 20
# (endpoint, a valid request body as its shard row holds it) -> its prompt tokens as the
# model's workers count them; None where it cannot count them (the upper bound is used).
TokenCounter = Callable[[str, dict[str, Any]], int | None]
MESSAGES_HINT = ("a messages cell must be a list of {role, content} structs, or a JSON array "
                 'of them as text, e.g. [{"role": "user", "content": "Hi"}]; this one is not')


@dataclass
class ShardPlan:
    """What validation produced: shard objects written, counts, and errors."""

    shards: list[int] = field(default_factory=list)  # rows per shard, by index
    # Shards that are views of a dataset in place (jobs/batches/views.py), by index:
    # each one's ``Shard.source``; empty when the shards are objects of their own.
    views: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    invalid: int = 0
    model: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0
    input_tokens: int = 0  # the valid requests' prompt tokens (see exact_tokens)
    exact_tokens: bool = True  # every request counted by the tokenizer, none by its bound

    def fail(self, code: str, message: str, line: int | None, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})


class Sharder:
    def __init__(self, store: ObjectStore, batch_id: str, endpoint: str, shard_rows: int,
                 max_inputs: int, max_requests: int, models: Catalog,
                 count_tokens: TokenCounter | None = None) -> None:
        self.store, self.batch_id, self.endpoint = store, batch_id, endpoint
        self.count_tokens = count_tokens
        self.models = models  # the registry, read once for the whole batch
        self.shard_rows, self.max_inputs, self.max_requests = shard_rows, max_inputs, max_requests
        self.plan = ShardPlan()
        self.rows: list[tuple[int, str, str, int]] = []
        self.seen: set[bytes] = set()
        self.invalid_lines: list[bytes] = []
        self.single_input = False  # Parquet datasets: one text per row
        # Shard writes in flight (at most PUTS_IN_FLIGHT): the next shard is cut while
        # the last ones go up.
        self.pool = ThreadPoolExecutor(PUTS_IN_FLIGHT, thread_name_prefix="shard-put")
        self.puts: deque[Future[int]] = deque()

    def add(self, line_no: int, custom_id: Any, body: Any,
            problem: InvalidRequest | None = None) -> None:
        """Check one request; queue it for a shard or record why not. ``problem``: why
        its body is already known to be invalid (an error line, as a schema error)."""
        plan = self.plan
        if custom_id is None or custom_id == "":
            return plan.fail("missing_custom_id", "custom_id is required (a non-empty string)",
                             line_no, "custom_id")
        if not isinstance(custom_id, str):
            return plan.fail("invalid_custom_id", f"custom_id must be a string, got "
                             f"{_json_type(custom_id)} {shown(custom_id)}; quote it",
                             line_no, "custom_id")
        digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
        if digest in self.seen:
            return plan.fail("duplicate_custom_id", f"custom_id {shown(custom_id)} appears "
                             "more than once", line_no, "custom_id")
        self.seen.add(digest)
        if not isinstance(body, dict):
            return plan.fail("invalid_body", "body must be a JSON object", line_no, "body")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return plan.fail("missing_model", "body.model is required", line_no, "body.model")
        try:
            self.models.require(model, self.endpoint, param="body.model", versions=True)
        except InvalidRequest as e:
            return plan.fail(MODEL_NOT_FOUND, e.message, line_no, "body.model")
        if plan.model is None:
            plan.model = model
        elif model != plan.model:
            return plan.fail("mismatched_model", f"all requests in a batch must use one model "
                             f"(line uses {shown(model)}, first line {shown(plan.model)})",
                             line_no, "body.model")
        plan.total += 1
        if plan.total > self.max_requests:
            if plan.total == self.max_requests + 1:
                plan.fail("too_many_requests", f"a batch holds at most {self.max_requests} "
                          "requests", line_no)
            return None
        try:
            if problem is not None:
                raise problem
            text, length = self.parse(body)
        except InvalidRequest as e:
            plan.invalid += 1
            self.invalid_lines.append(outputs.invalid_request_line(
                custom_id, e.message, e.code or "invalid_request", e.param))
            return None
        self.rows.append((line_no, custom_id, text, length))
        if len(self.rows) >= self.shard_rows:
            self.flush()
        return None

    def parse(self, body: dict[str, Any]) -> tuple[str, int]:
        """The body as the endpoint's schema reads it, as JSON text (the schema reads
        bytes as text, which JSON cannot hold), and its size estimate; InvalidRequest
        if it does not fit."""
        if self.endpoint == EMBEDDINGS:
            req: Any = parse_embeddings(body, self.max_inputs, self.models)
            if self.single_input and not isinstance(req.input, str):
                raise InvalidRequest("a dataset row holds one text: the input cell must be a "
                                     "non-empty string", param="input")
        else:
            req = (parse_responses(body, self.models) if self.endpoint == RESPONSES
                   else parse_generation(self.endpoint, body, self.models))
            if req.stream:
                raise InvalidRequest("stream is not available in a batch", param="stream")
        try:
            clean: dict[str, Any] = req.model_dump(mode="json", exclude_unset=True)
            clean["model"] = split_ref(clean["model"])[0]  # the batch pins the version
            text = orjson.dumps(clean).decode()
            length = text_length(as_chat(self.endpoint, clean)[1])
        except (TypeError, ValueError):  # a value JSON cannot hold (the schema lets none by)
            raise InvalidRequest("the request holds a value JSON cannot hold (binary data "
                                 "that is not UTF-8 text, say); send text") from None
        self.plan.input_tokens += self.prompt_tokens(clean)
        return text, length

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """The prompt tokens of a valid body: counted by ``count_tokens``, else bounded."""
        endpoint, body = as_chat(self.endpoint, body)  # a Responses body: its chat request
        exact = self.count_tokens(endpoint, body) if self.count_tokens else None
        if exact is not None:
            return exact
        self.plan.exact_tokens = False
        return prompt_tokens(endpoint, body)

    def flush(self) -> None:
        if not self.rows or self.plan.error_count:
            self.rows = []
            return
        index = len(self.plan.shards)
        while len(self.puts) >= PUTS_IN_FLIGHT:
            self.puts.popleft().result()
        self.puts.append(self.pool.submit(self.store.put_bytes,
                                          keys.shard_input(self.batch_id, index),
                                          shard_bytes(self.rows)))
        self.plan.shards.append(len(self.rows))
        self.rows = []

    def finish(self) -> ShardPlan:
        if self.plan.total == 0 and not self.plan.error_count and not self.plan.invalid:
            self.plan.fail("empty_file", "the input file has no requests", None)
        self.flush()
        self.close()
        if self.plan.error_count:
            self.store.delete_prefix(keys.batch_prefix(self.batch_id))
            self.plan.shards = []
        elif self.invalid_lines:
            self.store.put_bytes(keys.validation_errors(self.batch_id),
                                 b"".join(self.invalid_lines))
        return self.plan


    def close(self) -> None:
        """Wait for the shard writes in flight (the first failure is raised)."""
        try:
            while self.puts:
                self.puts.popleft().result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


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


def _json_type(v: Any) -> str:
    for t, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"),
                    (list, "an array"), (dict, "an object")):
        if isinstance(v, t):
            return name
    return f"a {type(v).__name__}"


def shard_jsonl(s: Sharder, stream: IO[bytes], max_line: int,
                defaults: dict[str, Any] | None = None) -> None:
    """One request per line; a line's body is merged over ``defaults`` (the batch's
    ``body``): its own fields win, as a dataset's input column does."""
    defaults = defaults or {}
    first = True
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
            obj = e
        if first and not isinstance(obj, dict) and not text.lstrip().startswith("{"):
            # Not JSONL at all (CSV, TSV, plain text): say so once, not once per line.
            s.plan.fail("invalid_file_format", f"the input file is not JSONL: its first line "
                        f"is not a JSON object ({text.strip()[:60]!r}). A batch input is JSONL "
                        "(one request object per line) or Parquet; convert the file to one "
                        "of these", n)
            return
        first = False
        if isinstance(obj, orjson.JSONDecodeError):
            s.plan.fail("invalid_json_line", f"line is not valid JSON: {obj}", n)
            continue
        if not isinstance(obj, dict):
            s.plan.fail("invalid_json_line", "line must be a JSON object", n)
            continue
        if obj.get("method", "POST") != "POST":
            s.plan.fail("invalid_method", "method must be POST", n, "method")
            continue
        if obj.get("url") != s.endpoint:
            s.plan.fail("invalid_url", f"url must be {s.endpoint} (the batch's endpoint), got "
                        f"{shown(obj.get('url'))}", n, "url")
            continue
        body = obj.get("body")
        s.add(n, obj.get("custom_id"), {**defaults, **body} if isinstance(body, dict) else body)


def shard_parquet(s: Sharder, path: Path, defaults: dict[str, Any]) -> None:
    """One request per row: ``custom_id`` and the endpoint's input column (``input``,
    ``prompt`` or ``messages``), merged over ``defaults`` (the batch's ``body``, which
    names the model). ``messages`` is a list of structs (role, content) or a JSON text
    of that list; a cell that is neither is that row's error line."""
    cols = dataset_columns(path)
    column = DATASET_COLUMN.get(s.endpoint, "input")
    if "custom_id" not in cols or column not in cols:
        s.plan.fail("invalid_dataset", _missing_columns(s.endpoint, column, cols), None)
        return
    if "model" not in defaults:
        s.plan.fail("missing_model", "a Parquet input names no model: give the batch's "
                    "body.model (--model in the CLI)", None, "body.model")
        return
    n = 0
    s.single_input = True
    for rows in iter_dataset(path):
        for row in rows:
            n += 1
            value = row[column]
            problem = None
            if column == "messages" and isinstance(value, str | bytes):
                value = json_messages(value)
                if value is None:
                    problem = InvalidRequest(MESSAGES_HINT, param="messages",
                                             code="invalid_messages")
            s.add(n, row["custom_id"], {**defaults, column: value}, problem)


def _missing_columns(endpoint: str, column: str, cols: list[str]) -> str:
    """Which columns a dataset for ``endpoint`` needs, which it has, and which column
    each endpoint reads (a chat dataset sent to /v1/embeddings, say)."""
    has = ", ".join(shown(c, 40) for c in cols[:MAX_COLUMNS_SHOWN]) or "none"
    if len(cols) > MAX_COLUMNS_SHOWN:
        has += f" and {len(cols) - MAX_COLUMNS_SHOWN} more"
    article = "an" if column[:1] in "aeiou" else "a"
    each = ", ".join(f"{c} for {ep}" for ep, c in DATASET_COLUMN.items())
    return (f"a Parquet input for {endpoint} needs a custom_id column and {article} {column} "
            f"column; this file has: {has}. The input column depends on the endpoint: "
            f"{each}")


def json_messages(text: str | bytes) -> list[Any] | None:
    """A ``messages`` cell given as JSON text: the list it holds (None if it holds none)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


# A dataset batch's reader (jobs/batches/datasets.py): its manifest into the sharder.
DatasetReader = Callable[["Sharder", bytes], None]


def validate_and_shard(store: ObjectStore, *, batch_id: str, file_key: str, file_format: str,
                       endpoint: str, defaults: dict[str, Any], shard_rows: int, max_line: int,
                       max_inputs: int, max_requests: int, models: Catalog,
                       count_tokens: TokenCounter | None = None,
                       read_dataset: DatasetReader | None = None) -> ShardPlan:
    """Validate the input file against ``models`` (the registry, read once by the
    caller for this batch) and write its shards; returns what was found.
    ``count_tokens``: counts each valid request's prompt tokens exactly (the upper
    bound when None). ``read_dataset`` reads a ``dataset`` file's rows in place."""
    s = Sharder(store, batch_id, endpoint, shard_rows, max_inputs, max_requests, models,
                count_tokens)
    try:
        if file_format == "dataset":
            assert read_dataset is not None, "a dataset batch needs its reader"
            read_dataset(s, store.get_bytes(file_key))
        elif file_format == "parquet":
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "input.parquet"
                store.download(file_key, path)
                try:
                    shard_parquet(s, path, defaults)
                except (OSError, ValueError) as e:  # pyarrow's errors derive from these
                    s.plan.fail("invalid_dataset", f"the Parquet file cannot be read: "
                                f"{shown(str(e), 300)}", None)
        else:
            with store.open(file_key) as stream:
                shard_jsonl(s, stream, max_line, defaults)
    except BaseException:
        s.close()
        raise
    return s.finish()
