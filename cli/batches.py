"""``inferq submit`` and ``status``: batches through the API, as a client; and what the
commands about batches share (the API options, a batch's summary and its errors)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from cli.body_defaults import body_defaults
from cli.client import api_url_option, connect
from cli.datasets import create_batch, dataset_body, is_dataset_uri
from cli.event_stream import follow_events
from jobs.core.settings import Settings
from jobs.core.status import TERMINAL, BatchStatus

HEAD_BYTES = 64  # enough of a file's start to tell its format
FILE_KEY_SUFFIX = ":file"  # the upload's Idempotency-Key is the batch's plus this
ROWS_FAILED = 3  # `status --exit-code`: the batch ended without every request completed


def with_client(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--api-key", envvar="INFERQ_API_KEY", default=None,
                     help="default: the dev key of the data dir")(f)
    return api_url_option(f)


def api_client(api_url: str | None, api_key: str | None) -> Any:
    return connect(Settings.from_env(), api_url, api_key)


def parse_metadata(pairs: Iterable[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--metadata")
        out[key] = value
    return out or None


def is_parquet_file(path: Path) -> bool:
    from storage.parquet import is_parquet

    with path.open("rb") as fh:
        return is_parquet(fh.read(HEAD_BYTES))


def check_idempotency_key(key: str) -> str:
    """The key as the API takes it, with room for the upload's suffix (a usage error
    otherwise, before anything is sent)."""
    from jobs.core.idempotency import MAX_KEY

    limit = MAX_KEY - len(FILE_KEY_SUFFIX)
    if not key or len(key) > limit or not (key.isascii() and key.isprintable()):
        raise click.BadParameter(f"1 to {limit} printable ASCII characters (the upload "
                                 f"sends it with {FILE_KEY_SUFFIX!r} appended; the API "
                                 f"takes {MAX_KEY})", param_hint="--idempotency-key")
    return key


def grouped_errors(b: Any) -> list[str]:
    """A batch's errors, one line per distinct (code, message) with its count and lines."""
    data = b.errors.data if b.errors and b.errors.data else []
    groups: dict[tuple[str, str], list[int | None]] = {}
    for e in data:
        groups.setdefault((e.code or "error", e.message or ""), []).append(e.line)
    out = []
    for (code, message), lines in groups.items():
        nums = sorted(x for x in lines if x is not None)
        where = ""
        if nums:
            where = f" (line {nums[0]})" if len(nums) == 1 else \
                f" ({len(nums)} lines, {nums[0]}–{nums[-1]})"
        elif len(lines) > 1:
            where = f" ({len(lines)} times)"
        out.append(f"{code}: {message}{where}")
    return out


def _field(b: Any, name: str) -> Any:
    """A field the SDK's Batch may not declare (then the API's value is an extra)."""
    return getattr(b, name, None) or (b.model_extra or {}).get(name)


def _get(obj: Any, name: str) -> int:
    """A count of the batch's usage (an object of the SDK, or a dict as an extra)."""
    return int((obj.get(name) if isinstance(obj, dict) else getattr(obj, name, 0)) or 0)


def summary(b: Any) -> str:
    rc = b.request_counts
    counts = f"{rc.completed} completed, {rc.failed} failed" if rc else "no requests counted"
    return f"{b.id}: {b.status} ({counts})"


def failure(b: Any) -> str:
    reasons = grouped_errors(b)
    return f"batch {b.id} {b.status}: " + ("; ".join(reasons) if reasons else "no reason given")


@click.command()
@click.argument("path")
@click.option("--endpoint", default="/v1/embeddings", show_default=True)
@click.option("--model", default=None,
              help="model of every row (needed for a Parquet input; a JSONL line that "
                   "names its own model keeps it)")
@click.option("--metadata", multiple=True, metavar="KEY=VALUE", help="batch metadata (repeatable)")
@click.option("--service-tier", type=click.Choice(["default", "flex", "auto"]), default=None,
              help="flex: low priority, served by spot workers")
@click.option("--idempotency-key", default=None,
              help="submitting again with the same key and file returns the same batch")
@click.option("--wait/--no-wait", default=False,
              help="follow its progress (the batch's event stream) until it ends")
@click.option("--expires-after", type=click.IntRange(3600, 30 * 86400), default=None,
              metavar="SECONDS", help="the uploaded input file expires this long after "
              "it is made (3600 to 2592000; default: kept until deleted)")
@click.option("--output-expires-after", type=click.IntRange(3600, 30 * 86400), default=None,
              metavar="SECONDS", help="its output and error files expire this long after "
              "they are made (3600 to 2592000; default: kept until deleted)")
@click.option("--id-column", default=None, help="dataset: the column of each row's custom_id "
              "(default custom_id)")
@click.option("--input-column", default=None, help="dataset: the column of each row's input")
@click.option("--template", default=None, metavar="TEXT",
              help="dataset: each row's input from its columns, e.g. 'Review: {title} {body}'")
@click.option("--system", default=None, help="dataset: a system prompt (chat, responses)")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default=None,
              help="dataset: the objects' format (default: from their names)")
@click.option("--output", default=None, metavar="URI",
              help="dataset: also write the results as Parquet under this empty prefix")
@click.option("--max-tokens", type=click.IntRange(1), default=None,
              help="every request's max_tokens (max_output_tokens for /v1/responses)")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None,
              help="every request's temperature")
@click.option("--response-format", "response_fmt", default=None, metavar="@SCHEMA.json",
              help="structured output of every request: a JSON schema (@file or inline), "
                   "sent as response_format json_schema; or text, json_object")
@click.option("--body-default", "body_pairs", multiple=True, metavar="KEY=JSON",
              help="any other request parameter of every request, e.g. top_p=0.9 "
                   "(repeatable; a value that is not JSON is a string)")
@click.option("--defaults", "defaults_file", default=None, metavar="@FILE.json",
              help="request parameters of every request from a JSON object (@file or "
                   "inline); the options above win over it")
@with_client
def submit(path: str, endpoint: str, model: str | None, metadata: tuple[str, ...],
           service_tier: str | None, idempotency_key: str | None, wait: bool,
           expires_after: int | None, output_expires_after: int | None,
           id_column: str | None, input_column: str | None, template: str | None,
           system: str | None, fmt: str | None, output: str | None,
           max_tokens: int | None, temperature: float | None, response_fmt: str | None,
           body_pairs: tuple[str, ...], defaults_file: str | None,
           api_url: str | None, api_key: str | None) -> None:
    """Create a batch over PATH; prints its id. PATH is a local file (JSONL or Parquet,
    uploaded first) or a dataset in place: s3://bucket/key, a prefix (ending in /) or a
    glob (s3://bucket/reviews/*.parquet), read where it is.

    The request parameters (--model, --max-tokens, --temperature, --response-format,
    --body-default, --defaults) are the batch's defaults: every row of a dataset or a
    Parquet file takes them; a JSONL line's own fields win over them."""
    meta = parse_metadata(metadata)
    defaults = body_defaults(endpoint, model, max_tokens, temperature, response_fmt,
                             body_pairs, defaults_file)
    dataset = is_dataset_uri(path)
    mapping = {"--id-column": id_column, "--input-column": input_column,
               "--template": template, "--system": system, "--format": fmt,
               "--output": output}
    if not dataset:
        given = [k for k, v in mapping.items() if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: for a dataset URI (s3://…)")
        local = Path(path)
        if not local.is_file():
            raise click.BadParameter(f"no file {path!r} (a dataset in place is a URI: "
                                     "s3://bucket/key)", param_hint="PATH")
    elif expires_after is not None:
        raise click.UsageError("--expires-after: a dataset in place is not uploaded")
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    client = api_client(api_url, api_key)
    if dataset:
        fields = dataset_body(path, endpoint, defaults, fmt, id_column, input_column,
                              template, system, output)
        fields.update({"metadata": meta} if meta else {})
        fields.update({"service_tier": service_tier} if service_tier else {})
        if output_expires_after is not None:
            fields["output_expires_after"] = {"anchor": "created_at",
                                              "seconds": output_expires_after}
        b = create_batch(client, fields,
                         {"Idempotency-Key": idempotency_key} if idempotency_key else None)
        click.echo(b.id)
        if wait:
            wait_for(client, b.id)
        return
    parquet = is_parquet_file(local)
    if "model" not in defaults and parquet:
        raise click.ClickException("a Parquet input names no model: pass --model "
                                   "(e.g. --model all-MiniLM-L6-v2)")
    body: dict[str, Any] = {}
    if defaults:
        body["body"] = defaults
    if service_tier:
        body["service_tier"] = service_tier

    def headers(suffix: str) -> dict[str, str] | None:
        return {"Idempotency-Key": idempotency_key + suffix} if idempotency_key else None

    with local.open("rb") as fh:
        f = client.files.create(file=(local.name, fh), purpose="batch",
                                extra_headers=headers(FILE_KEY_SUFFIX),
                                **({} if expires_after is None else {"expires_after": {
                                    "anchor": "created_at", "seconds": expires_after}}))
    b = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h",
                              metadata=meta, extra_body=body or None, extra_headers=headers(""),
                              **({} if output_expires_after is None else {
                                  "output_expires_after": {"anchor": "created_at",
                                                           "seconds": output_expires_after}}))
    click.echo(b.id)
    if wait:
        wait_for(client, b.id)


def wait_for(client: Any, batch_id: str) -> None:
    """Follow the batch until it ends, print its summary; a non-zero exit unless it
    completed."""
    b = follow_events(client, batch_id)
    click.echo(summary(b))
    if b.status != BatchStatus.COMPLETED:
        raise click.ClickException(failure(b))


@click.command()
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True, help="the batch object as the API returns it")
@click.option("--watch", is_flag=True,
              help="follow its progress (the batch's event stream) until it ends, then show it")
@click.option("--exit-code", "exit_code", is_flag=True,
              help=f"exit with status {ROWS_FAILED} when the batch ended and did not "
                   "complete every request (some failed, or it failed, expired or was "
                   "cancelled)")
@with_client
def status(batch_id: str, as_json: bool, watch: bool, exit_code: bool, api_url: str | None,
           api_key: str | None) -> None:
    """Show a batch: status, counts, errors (each distinct error code once, with its
    count, its message and the first requests that failed with it)."""
    client = api_client(api_url, api_key)
    b = (follow_events(client, batch_id, to_stderr=as_json) if watch
         else client.batches.retrieve(batch_id))
    if as_json:
        click.echo(b.model_dump_json(indent=2))
        _exit_status(b, exit_code)
        return
    click.echo(summary(b))
    click.echo(f"  endpoint:     {b.endpoint}  model: {_field(b, 'model') or '-'}  "
               f"service tier: {_field(b, 'service_tier') or '-'}")
    rc, usage = b.request_counts, _field(b, "usage")
    if rc and rc.total:
        tokens = (f"; {_get(usage, 'input_tokens'):,} input and "
                  f"{_get(usage, 'output_tokens'):,} output tokens" if usage else "")
        click.echo(f"  progress:     {rc.completed + rc.failed} of {rc.total} requests done"
                   f"{tokens}")
    if b.metadata:
        click.echo("  metadata:     " + ", ".join(f"{k}={v}" for k, v in b.metadata.items()))
    for name, file_id in (("output file", b.output_file_id), ("error file", b.error_file_id)):
        if file_id:
            click.echo(f"  {name + ':':<13} {file_id}")
    for line in grouped_errors(b):
        click.echo(f"  error:        {line}")
    if b.error_file_id and b.status in TERMINAL:
        from cli.row_errors import describe, row_errors

        for g in row_errors(client, b.error_file_id):
            click.echo(f"  failed:       {describe(g)}")
    _exit_status(b, exit_code)


def _exit_status(b: Any, exit_code: bool) -> None:
    """With ``--exit-code``: exit ROWS_FAILED when the batch ended without every request
    completed (some failed, or it failed, expired or was cancelled)."""
    if not exit_code or b.status not in TERMINAL:
        return
    rc = b.request_counts
    if b.status != BatchStatus.COMPLETED or (rc and rc.failed):
        raise click.exceptions.Exit(ROWS_FAILED)
