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
strings compared only for the hashes seen twice. Parquet rows of text become views
(jobs/batches/views.py), other rows shard objects (jobs/batches/dataset_copies.py);
the column kernels both use are jobs/batches/dataset_columns.py's.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import pyarrow.parquet as pq

from jobs.batches import locations, outputs
from jobs.batches.sharding import DATASET_COLUMN
from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, PermissionDenied, shown
from jobs.core.schema import File, new_id, now
from jobs.fleet import catalog
from jobs.fleet.catalog import Catalog
from jobs.protocol.batch import DatasetInput, DatasetOutput
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from jobs.protocol.parsing import parse_embeddings, parse_generation, parse_responses
from jobs.tenants.token_counts import prompt_tokens
from storage import datasets as ds
from storage import keys

MAX_FILES = 10_000
READ_ROWS = 65_536  # rows per record batch read
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


def _listed(loc: ds.Location, limit: int, param: str, root: ds.Location
            ) -> list[ds.SourceObject]:
    """The objects a URI names (a file:// one by its real path below ``root``); S3's
    refusals as the client's errors."""
    try:
        return ds.list_objects(loc, limit, root)
    except ds.NotFollowed as e:
        raise InvalidRequest(str(e), param=param, code="unsafe_path") from None
    except ds.BadLocation as e:
        raise InvalidRequest(str(e), param=param) from None
    except ds.NoBucket:
        raise InvalidRequest(f"no bucket {shown(loc.bucket)} in the object store",
                             param=param, code="dataset_not_found") from None
    except ds.AccessDenied:
        raise PermissionDenied(f"the service's object-store credentials may not list "
                               f"{shown(loc.uri, 200)}", param=param) from None


def _holds(loc: ds.Location) -> bool:
    try:
        return ds.holds_objects(loc)
    except ds.NoBucket:
        raise InvalidRequest(f"no bucket {shown(loc.bucket)} in the object store",
                             param="output_dataset.uri", code="dataset_not_found") from None


def open_dataset(ctx: Context, tenant_id: str, endpoint: str, spec: DatasetInput,
                 output: DatasetOutput | None, defaults: dict[str, Any],
                 models: Catalog) -> Manifest:
    """Check a dataset batch's locations and mapping, and list and pin its objects."""
    loc = locations.location(spec.uri, "input_dataset.uri")
    root = locations.require(ctx, tenant_id, loc, "read", "input_dataset.uri")
    out_uri = None
    if output is not None:
        out = locations.location(output.uri, "output_dataset.uri")
        if out.is_glob:
            raise InvalidRequest("output_dataset.uri is a prefix, not a glob",
                                 param="output_dataset.uri")
        out = ds.Location(out.scheme, out.bucket, out.key.rstrip("/") + "/")
        out_root = locations.require(ctx, tenant_id, out, "write", "output_dataset.uri")
        try:  # where it is, not through a link: what the writer opens, and reserves
            out = ds.local_real(out, out_root)
        except ds.NotFollowed as e:
            raise InvalidRequest(str(e), param="output_dataset.uri",
                                 code="unsafe_path") from None
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
    objs = _listed(loc, MAX_FILES, "input_dataset.uri", root)
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


def missing_columns(obj: ds.SourceObject, missing: list[str], have: list[str]) -> str:
    """The refusal of an object that lacks columns a row is read from."""
    has = ", ".join(shown(c, 40) for c in have[:20]) or "none"
    return (f"{shown(obj.uri, 200)} has no column {', '.join(shown(c, 40) for c in missing)}"
            f" (the id column, and the input column or the template's columns); its "
            f"columns: {has}")


def open_parquet(obj: ds.SourceObject, client: Any, columns: list[str]
                 ) -> tuple[Any, pq.ParquetFile]:
    """A dataset's Parquet object, read in its pinned version (close it when done), and
    its reader; Bad when it is not Parquet or lacks one of ``columns``."""
    f = ds.open_pinned(obj, client)
    try:
        pf = pq.ParquetFile(f)
    except (OSError, ValueError) as e:
        f.close()
        raise Bad("invalid_dataset", f"{shown(obj.uri, 200)} is not a readable Parquet "
                  f"file: {shown(str(e), 200)}") from None
    have = pf.schema_arrow.names
    missing = [c for c in columns if c not in have]
    if missing:
        f.close()
        raise Bad("invalid_dataset", missing_columns(obj, missing, have))
    return f, pf


def changed(e: ds.SourceChanged) -> str:
    return (f"{e}: a batch reads its dataset as it was when the batch was created; submit "
            "a new batch")


def create_input(ctx: Context, tenant_id: str, endpoint: str, spec: DatasetInput,
                 output: DatasetOutput | None, defaults: dict[str, Any]
                 ) -> tuple[File, str | None]:
    """The input File of a batch over a dataset in place: its manifest, stored as the
    File's content (``GET /v1/files/{id}/content`` shows what the batch reads); and the
    URI of its output dataset's prefix (the batch reserves it), if it has one."""
    manifest = open_dataset(ctx, tenant_id, endpoint, spec, output, defaults,
                            catalog.cached(ctx))
    data = manifest.to_json()
    f = File(id=new_id("file-"), tenant_id=tenant_id, filename=manifest.uri[:512],
             purpose="batch", format="dataset", bytes=len(data), created_at=now())
    f.object_key = keys.file_object(f.id)
    ctx.store.put_bytes(f.object_key, data)
    return f, manifest.output
