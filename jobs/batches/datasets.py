"""Batches over datasets in place: Parquet or JSONL rows read where the data team keeps them.

``POST /v1/batches`` with ``input_dataset`` (instead of ``input_file_id``) names the
objects (one, a prefix or a glob: storage.datasets) and how a row becomes a request:
``id_column`` is its custom_id; its input is ``input_column`` or ``template``
rendered over columns (``"Classify: {title}\\n{body}"``; a null cell renders as
nothing), under the batch's ``body`` defaults, with ``system`` as the system prompt
(chat; ``instructions`` for responses). Chat without either reads the conversation
from a ``messages`` column, as an uploaded Parquet file does.

At creation the URIs are checked against the project's read locations
(jobs/batches/locations.py), the objects listed and their ETags pinned in the batch's
input File (``format: dataset``, its content this manifest). Validation then reads
each object in that version only (a changed source fails the batch, ``source_changed``),
streamed by record batch, only the columns it needs, and cuts shards as for an
upload; the dataset is never copied whole. The columnar path renders and checks a
record batch at a time (one JSON body per row from a prefix checked once against the
endpoint's schema); ids are checked for repeats with a 64-bit hash per row, the
strings compared only for the hashes seen twice.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.batches import locations, outputs
from jobs.batches.sharding import DATASET_COLUMN, MESSAGES_HINT, Sharder, json_messages
from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, PermissionDenied, shown
from jobs.core.schema import File, new_id, now
from jobs.fleet import catalog
from jobs.fleet.catalog import Catalog
from jobs.protocol.requests import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RESPONSES,
    DatasetInput,
    DatasetOutput,
    parse_embeddings,
    parse_generation,
    parse_responses,
)
from jobs.tenants.limits import prompt_tokens
from storage import datasets as ds
from storage import keys
from storage.objects import buffered

MAX_FILES = 10_000
READ_ROWS = 65_536  # rows per record batch read
JSONL_ROWS = 10_000  # JSONL rows gathered into one record batch
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".json": "jsonl"}
# The input field a row's text fills, by endpoint (chat: the user message's content).
TEXT_FIELD = {EMBEDDINGS: "input", COMPLETIONS: "prompt", RESPONSES: "input", CHAT: "messages"}
SAMPLE = "x"


@dataclass
class Manifest:
    """What a dataset batch reads (its input File's content): the pinned objects and
    the mapping from rows to requests; ``output``, where its results are written."""

    uri: str
    format: str
    id_column: str
    input_column: str | None
    template: str | None
    system: str | None
    files: list[ds.SourceObject]
    endpoint: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    output: str | None = None

    @property
    def columns(self) -> list[str]:
        """The columns a row is read from: the id column, then the input's."""
        inputs = (template_fields(self.template) if self.template is not None
                  else [self.input_column or DATASET_COLUMN[self.endpoint]])
        return list(dict.fromkeys([self.id_column, *inputs]))

    @property
    def pieces(self) -> list[tuple[str, str | None]]:
        """The template's (literal, column) pieces; the input column alone without one."""
        if self.template is None:
            return [("", self.input_column or DATASET_COLUMN[self.endpoint])]
        return [(lit, name) for lit, name, _s, _c in string.Formatter().parse(self.template)]

    @property
    def conversations(self) -> bool:
        """Chat rows holding whole conversations (a ``messages`` column), not a text."""
        return self.template is None and self.input_column is None and self.endpoint == CHAT

    def to_json(self) -> bytes:
        return orjson.dumps({"object": "inferq.dataset", **asdict(self)},
                            option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        d = orjson.loads(data)
        d.pop("object", None)
        d["files"] = [ds.SourceObject(**f) for f in d["files"]]
        return cls(**d)


class Bad(Exception):
    """A whole-dataset problem: (code, message, param)."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


# Creation: check, list, pin ------------------------------------------------------------------


def template_fields(template: str) -> list[str]:
    """The column names a template reads; InvalidRequest for anything but ``{column}``
    fields (no format specs, conversions, attributes or indexes)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise InvalidRequest(f"the template is not valid: {e} (write a literal brace as "
                             "{{ or }})", param="input_dataset.template") from None
    names = []
    for _lit, name, spec, conv in parsed:
        if name is None:
            continue
        if not name or spec or conv or any(c in name for c in ".[]"):
            field_ = name + ("!" + conv if conv else "") + (":" + spec if spec else "")
            raise InvalidRequest(f"a template field is a column name in braces, like {{title}}; "
                                 f"got {{{shown(field_, 60)}}}", param="input_dataset.template")
        names.append(name)
    if not names:
        raise InvalidRequest("the template names no column: write one in braces, like "
                             "{title}", param="input_dataset.template")
    return list(dict.fromkeys(names))


def _check_mapping(endpoint: str, spec: DatasetInput) -> None:
    if spec.system is not None and endpoint not in (CHAT, RESPONSES):
        raise InvalidRequest(f"input_dataset.system is a system prompt: {endpoint} has none",
                             param="input_dataset.system")
    if spec.template is not None:
        template_fields(spec.template)


def _format_of(objs: list[ds.SourceObject], given: str | None) -> str:
    if given is not None:
        return given
    found = set()
    for o in objs:
        name = o.uri.rsplit("/", 1)[-1].lower()
        ext = name[name.rfind("."):] if "." in name else ""
        if ext not in FORMATS:
            raise InvalidRequest(f"{shown(o.uri, 200)}: its format is not known from its name "
                                 "(.parquet or .jsonl); give input_dataset.format",
                                 param="input_dataset.format")
        found.add(FORMATS[ext])
    if len(found) > 1:
        raise InvalidRequest("the dataset mixes Parquet and JSONL objects: name one format "
                             "with a glob (*.parquet)", param="input_dataset.uri")
    return found.pop()


def _listed(loc: ds.Location, limit: int, param: str) -> list[ds.SourceObject]:
    """The objects a URI names; S3's refusals as the client's errors."""
    from botocore.exceptions import ClientError

    try:
        return ds.list_objects(loc, limit)
    except ds.BadLocation as e:
        raise InvalidRequest(str(e), param=param) from None
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code == "NoSuchBucket":
            raise InvalidRequest(f"no bucket {shown(loc.bucket)} in the object store",
                                 param=param, code="dataset_not_found") from None
        if code in ("AccessDenied", "403"):
            raise PermissionDenied(f"the service's object-store credentials may not list "
                                   f"{shown(loc.uri, 200)}", param=param) from None
        raise


def _holds(loc: ds.Location) -> bool:
    from botocore.exceptions import ClientError

    try:
        return ds.holds_objects(loc)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "NoSuchBucket":
            raise InvalidRequest(f"no bucket {shown(loc.bucket)} in the object store",
                                 param="output_dataset.uri", code="dataset_not_found") from None
        raise


def open_dataset(ctx: Context, tenant_id: str, endpoint: str, spec: DatasetInput,
                 output: DatasetOutput | None, defaults: dict[str, Any],
                 models: Catalog) -> Manifest:
    """Check a dataset batch's locations and mapping, and list and pin its objects."""
    loc = locations.location(spec.uri, "input_dataset.uri")
    locations.require(ctx, tenant_id, loc, "read", "input_dataset.uri")
    out_uri = None
    if output is not None:
        out = locations.location(output.uri, "output_dataset.uri")
        if out.is_glob:
            raise InvalidRequest("output_dataset.uri is a prefix, not a glob",
                                 param="output_dataset.uri")
        out = ds.Location(out.scheme, out.bucket, out.key.rstrip("/") + "/")
        locations.require(ctx, tenant_id, out, "write", "output_dataset.uri")
        if _holds(out):
            raise InvalidRequest(f"{shown(out.uri, 200)} holds objects already: an output "
                                 "dataset is written to an empty prefix",
                                 param="output_dataset.uri", code="output_exists")
        out_uri = out.uri
        taken = set(outputs.parquet_schema(endpoint).names) - {"custom_id"}
        if spec.id_column in taken:
            raise InvalidRequest(f"the id column {shown(spec.id_column)} has the name of an "
                                 f"output column ({', '.join(sorted(taken))}): rename it",
                                 param="input_dataset.id_column")
    _check_mapping(endpoint, spec)
    if "model" in defaults:
        RowForm.build(endpoint, defaults, spec, models)  # bad defaults fail now, once
    objs = _listed(loc, MAX_FILES, "input_dataset.uri")
    if not objs:
        raise InvalidRequest(f"no objects match {shown(loc.uri, 200)}", param="input_dataset.uri",
                             code="dataset_empty")
    return Manifest(uri=loc.uri, format=_format_of(objs, spec.format), id_column=spec.id_column,
                    input_column=spec.input_column, template=spec.template, system=spec.system,
                    files=objs, endpoint=endpoint, defaults=defaults, output=out_uri)


# Validation: rows to shards ------------------------------------------------------------------


@dataclass
class RowForm:
    """How a row's text becomes its request body: ``head + json(text) + tail``, checked
    once against the endpoint's schema (``fast`` False: each row is parsed instead)."""

    endpoint: str
    defaults: dict[str, Any]
    head: bytes = b""
    tail: bytes = b""
    fast: bool = True
    overhead: int = 0  # the bound's prompt tokens besides the text's bytes
    extra_len: int = 0  # the system prompt's length (the rows' sort key)

    @classmethod
    def build(cls, endpoint: str, defaults: dict[str, Any], spec: DatasetInput | Manifest,
              models: Catalog | None) -> RowForm:
        form = cls(endpoint, dict(defaults))
        if spec.system is not None and endpoint == RESPONSES:
            form.defaults["instructions"] = spec.system
        sample = form.parsed(SAMPLE, spec.system, models)
        rest = {k: v for k, v in sample.items() if k != TEXT_FIELD[endpoint]}
        form.head = (orjson.dumps(rest)[:-1] + b"," if rest else b"{") + \
            f'"{TEXT_FIELD[endpoint]}":'.encode()
        form.tail = b"}"
        if endpoint == CHAT:
            system = ([orjson.dumps({"role": "system", "content": spec.system}) + b","]
                      if spec.system is not None else [b""])[0]
            form.head += b"[" + system + b'{"role":"user","content":'
            form.tail = b"}]}"
            form.extra_len = len(spec.system or "")
        form.fast = orjson.loads(form.body(SAMPLE)) == sample
        # The bound is the text's UTF-8 bytes plus what the rest adds (checked linear).
        form.overhead = prompt_tokens(endpoint, sample) - len(SAMPLE)
        form.fast = form.fast and prompt_tokens(endpoint, form.parsed("abc", spec.system, None)) \
            == form.overhead + 3
        return form

    def request(self, text: str, system: str | None) -> dict[str, Any]:
        if self.endpoint == CHAT:
            msgs = ([{"role": "system", "content": system}] if system is not None else [])
            return {**self.defaults, "messages": [*msgs, {"role": "user", "content": text}]}
        return {**self.defaults, TEXT_FIELD[self.endpoint]: text}

    def parsed(self, text: str, system: str | None, models: Catalog | None) -> dict[str, Any]:
        """The request of a row holding ``text``, as the endpoint's schema reads it."""
        body = self.request(text, system)
        try:
            if self.endpoint == EMBEDDINGS:
                req: Any = parse_embeddings(body, 1, models)
            elif self.endpoint == RESPONSES:
                req = parse_responses(body, models)
            else:
                req = parse_generation(self.endpoint, body, models)
        except InvalidRequest as e:
            raise InvalidRequest(f"body: {e.message}", param=f"body.{e.param}" if e.param
                                 else "body", code=e.code) from None
        clean: dict[str, Any] = req.model_dump(mode="json", exclude_unset=True)
        return clean

    def body(self, text: str) -> bytes:
        return self.head + orjson.dumps(text) + self.tail


HASH_BASE = np.uint64(0x100000001B3)
HASH_LEN = np.uint64(0x9E3779B97F4A7C15)


def text_hashes(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each string of ``a`` (a polynomial over its bytes, computed
    over the Arrow buffers: no Python string is made, the GIL is free). Equal strings
    hash alike; a null hashes as the empty string."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    bufs = a.buffers()
    wide = pa.types.is_large_string(a.type) or pa.types.is_large_binary(a.type)
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[
        a.offset: a.offset + len(a) + 1].astype(np.int64)
    lens = np.diff(offsets)
    if a.null_count:
        lens[pc.is_null(a).to_numpy(zero_copy_only=False)] = 0
    h = lens.astype(np.uint64) * HASH_LEN
    start = offsets[0] if len(offsets) else 0
    if bufs[2] is None or not lens.any():
        return h
    data = np.frombuffer(bufs[2], dtype=np.uint8)[start:offsets[-1]]
    nz = lens > 0
    keep = np.repeat(nz, np.diff(offsets))  # bytes of nulls (if any) are skipped
    row_starts = np.cumsum(np.concatenate(([0], lens[:-1])))
    pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(row_starts, lens)
    powers = np.cumprod(np.full(int(lens.max()), HASH_BASE, dtype=np.uint64))
    contrib = (data[keep].astype(np.uint64) + np.uint64(1)) * powers[pos]
    h[nz] += np.add.reduceat(contrib, row_starts[nz])
    return h


@dataclass
class Ids:
    """Every custom_id's 64-bit hash (8 bytes a row, not the strings); ``repeated``
    says which hashes were seen twice, for a second look at those rows only."""

    chunks: list[np.ndarray] = field(default_factory=list)

    def add(self, ids: pa.Array | pa.ChunkedArray) -> None:
        self.chunks.append(np.sort(text_hashes(ids)))  # sorted runs merge fast below

    def repeated(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, np.uint64)
        h = np.concatenate(self.chunks)
        h.sort(kind="stable")  # a merge of the sorted runs
        return np.unique(h[1:][h[1:] == h[:-1]])


def find_repeats(ids: Ids, columns: Iterator[pa.Array]) -> list[tuple[int, str]]:
    """(row, message) of each custom_id seen before, at most a hundred. ``columns``:
    the id column again, a record batch at a time in order (as text); only the rows
    whose hash was seen twice are looked at as strings."""
    repeated = ids.repeated()
    if not len(repeated):
        return []
    seen: dict[str, int] = {}
    out: list[tuple[int, str]] = []
    line = 0
    for col in columns:
        hit = np.flatnonzero(np.isin(text_hashes(col), repeated))
        for i, cid in zip(hit.tolist(), col.take(pa.array(hit)).to_pylist(), strict=True):
            n = line + i + 1
            if not cid:
                continue
            if cid in seen:
                out.append((n, f"custom_id {shown(cid)} (the id column) appears more than "
                               f"once: rows {seen[cid]} and {n}"))
                if len(out) >= 100:
                    return out
            else:
                seen[cid] = n
        line += len(col)
    return out


def as_text(col: pa.Array | pa.ChunkedArray, what: str) -> pa.Array:
    """A column as UTF-8 text: strings as they are, numbers and booleans printed."""
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_decimal(t) or pa.types.is_null(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_dictionary(t)):
        try:
            return pc.cast(col, pa.string())
        except pa.ArrowInvalid:
            pass
    raise Bad("invalid_dataset", f"{what} is of type {t}: it must be text (or numbers)")


def render(rb: pa.RecordBatch, pieces: list[tuple[str, str | None]]) -> pa.Array:
    """The template over a record batch: literal pieces and columns joined, row-wise."""
    args: list[Any] = []
    for lit, name in pieces:
        if lit:
            args.append(lit)
        if name is not None:
            args.append(as_text(rb.column(name), f"the template's column {shown(name)}"))
    if len(args) == 1 and not isinstance(args[0], str):
        return pc.fill_null(args[0], "")
    return pc.binary_join_element_wise(*args, "", null_handling="replace",
                                       null_replacement="")


class _DatasetSharder:
    def __init__(self, s: Sharder, manifest: Manifest, defaults: dict[str, Any],
                 models: Catalog, max_line: int) -> None:
        self.s, self.m, self.endpoint, self.max_line = s, manifest, s.endpoint, max_line
        self.defaults = defaults
        self.messages = manifest.conversations
        self.form = RowForm.build(self.endpoint, defaults, manifest, models)
        self.ids = Ids()
        self.client = ds.s3_client() if manifest.files[0].uri.startswith("s3://") else None
        self.pieces = manifest.pieces
        self.columns = manifest.columns

    # Reading ---------------------------------------------------------------------------------

    def batches(self, obj: ds.SourceObject, columns: list[str]) -> Iterator[pa.RecordBatch]:
        with ds.open_pinned(obj, self.client) as f:
            if self.m.format == "parquet":
                try:
                    pf = pq.ParquetFile(f)
                except (OSError, ValueError) as e:
                    raise Bad("invalid_dataset", f"{shown(obj.uri, 200)} is not a readable "
                               f"Parquet file: {shown(str(e), 200)}") from None
                have = pf.schema_arrow.names
                missing = [c for c in columns if c not in have]
                if missing:
                    raise Bad("invalid_dataset", self._missing(obj, missing, have))
                yield from pf.iter_batches(batch_size=READ_ROWS, columns=columns)
            else:
                yield from self._jsonl(obj, f, columns)

    def _missing(self, obj: ds.SourceObject, missing: list[str], have: list[str]) -> str:
        has = ", ".join(shown(c, 40) for c in have[:20]) or "none"
        return (f"{shown(obj.uri, 200)} has no column {', '.join(shown(c, 40) for c in missing)}"
                f" (the id column, and the input column or the template's columns); its "
                f"columns: {has}")

    def _jsonl(self, obj: ds.SourceObject, f: Any, columns: list[str]
               ) -> Iterator[pa.RecordBatch]:
        rows: list[dict[str, Any]] = []
        present: set[str] = set()
        n = 0
        reader = buffered(f)
        while line := reader.readline(self.max_line + 1):
            n += 1
            if len(line) > self.max_line:
                raise Bad("line_too_long", f"line {n} of {shown(obj.uri, 200)} is longer "
                           f"than {self.max_line} bytes")
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise Bad("invalid_json_line", f"line {n} of {shown(obj.uri, 200)} is not "
                           f"valid JSON: {e}") from None
            if not isinstance(value, dict):
                raise Bad("invalid_json_line", f"line {n} of {shown(obj.uri, 200)} is not a "
                           "JSON object")
            present.update(c for c in columns if c in value)
            rows.append({c: value.get(c) for c in columns})
            if len(rows) >= JSONL_ROWS:
                yield self._table(rows, columns, present, obj, n)
                rows = []
        if rows:
            yield self._table(rows, columns, present, obj, n)

    def _table(self, rows: list[dict[str, Any]], columns: list[str], present: set[str],
               obj: ds.SourceObject, n: int) -> pa.RecordBatch:
        missing = [c for c in columns if c not in present]
        if missing:  # in none of the rows so far: a mapping that names no field
            raise Bad("invalid_dataset", self._missing(obj, missing, sorted(present)))
        try:
            t = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise Bad("invalid_dataset", f"{shown(obj.uri, 200)}, lines up to {n}: a field "
                       f"mixes types ({shown(str(e), 200)})") from None
        return t.combine_chunks().to_batches()[0]

    # Rows ------------------------------------------------------------------------------------

    def run(self) -> None:
        s = self.s
        s.plan.model = self.defaults.get("model")
        line = 0
        for obj in self.m.files:
            for rb in self.batches(obj, self.columns):
                if s.plan.error_count >= 100 or s.plan.total > s.max_requests:
                    return
                self.rows(rb, line, obj)
                line += rb.num_rows
        for h_line, message in self._repeats():
            s.plan.fail("duplicate_custom_id", message, h_line, "input_dataset.id_column")

    def rows(self, rb: pa.RecordBatch, first: int, obj: ds.SourceObject) -> None:
        s, form = self.s, self.form
        ids = as_text(rb.column(self.m.id_column), f"the id column {shown(self.m.id_column)}")
        id_list = ids.to_pylist()
        self.ids.add(ids)
        if self.messages:
            return self._messages(rb, first, id_list)
        text = render(rb, self.pieces)
        texts = text.to_pylist()
        lens = pc.utf8_length(text).to_pylist()
        nbytes = pc.binary_length(text).to_pylist()
        param = ("input_dataset.template" if self.m.template is not None
                 else "input_dataset.input_column")
        plan = s.plan
        for i, cid in enumerate(id_list):
            n = first + i + 1
            if not cid:
                plan.fail("missing_custom_id", f"row {n}: the id column "
                          f"{shown(self.m.id_column)} is empty", n, "input_dataset.id_column")
                continue
            plan.total += 1
            if plan.total > s.max_requests:
                plan.fail("too_many_requests", f"a batch holds at most {s.max_requests} "
                          "requests", n)
                return
            t = texts[i]
            if not t:
                plan.invalid += 1
                s.invalid_lines.append(outputs.invalid_request_line(
                    cid, f"row {n}: the input is empty", "empty_input", param))
                continue
            if form.fast:
                body = form.body(t)
                plan.input_tokens += form.overhead + nbytes[i]
            else:
                try:
                    clean = form.parsed(t, self.m.system, None)
                except InvalidRequest as e:
                    plan.invalid += 1
                    s.invalid_lines.append(outputs.invalid_request_line(
                        cid, e.message, e.code or "invalid_request", e.param))
                    continue
                body = orjson.dumps(clean)
                plan.input_tokens += prompt_tokens(self.endpoint, clean)
            s.rows.append((n, cid, body.decode(), lens[i] + form.extra_len))
            if len(s.rows) >= s.shard_rows:
                s.flush()
        plan.exact_tokens = False

    def _messages(self, rb: pa.RecordBatch, first: int, id_list: list[Any]) -> None:
        """Chat rows holding their conversation (as an uploaded Parquet file's): each
        parsed as its own request."""
        column = self.columns[1]
        for i, (cid, value) in enumerate(zip(id_list, rb.column(column).to_pylist(),
                                             strict=True)):
            problem = None
            if isinstance(value, str | bytes):
                value = json_messages(value)
                if value is None:
                    problem = InvalidRequest(MESSAGES_HINT, param="messages",
                                             code="invalid_messages")
            self.s.seen.clear()  # repeats are found by hash, below
            self.s.add(first + i + 1, cid, {**self.defaults, "messages": value}, problem)

    def _repeats(self) -> list[tuple[int, str]]:
        return find_repeats(self.ids, (
            as_text(rb.column(0), "the id column") for obj in self.m.files
            for rb in self.batches(obj, [self.m.id_column])))


def changed(e: ds.SourceChanged) -> str:
    return (f"{e}: a batch reads its dataset as it was when the batch was created; submit "
            "a new batch")


def shard_dataset(s: Sharder, manifest: Manifest, defaults: dict[str, Any],
                  models: Catalog, max_line: int) -> None:
    """Validate the manifest's rows into ``s``'s shards (whole-dataset problems are the
    plan's errors, with their row numbers counted across the objects in order)."""
    try:
        _DatasetSharder(s, manifest, defaults, models, max_line).run()
    except Bad as e:
        s.plan.fail(e.code, e.message, None, e.param)
    except ds.SourceChanged as e:
        s.plan.fail("source_changed", changed(e), None, "input_dataset.uri")
    except InvalidRequest as e:
        s.plan.fail(e.code or "invalid_request", e.message, None, e.param)


def create_input(ctx: Context, tenant_id: str, endpoint: str, spec: DatasetInput,
                 output: DatasetOutput | None, defaults: dict[str, Any]) -> File:
    """The input File of a batch over a dataset in place: its manifest, stored as the
    File's content (``GET /v1/files/{id}/content`` shows what the batch reads)."""
    manifest = open_dataset(ctx, tenant_id, endpoint, spec, output, defaults,
                            catalog.cached(ctx))
    data = manifest.to_json()
    f = File(id=new_id("file-"), tenant_id=tenant_id, filename=manifest.uri[:512],
             purpose="batch", format="dataset", bytes=len(data), created_at=now())
    f.object_key = keys.file_object(f.id)
    ctx.store.put_bytes(f.object_key, data)
    return f
