"""``inferq submit``, ``status`` and ``results``: batches through the API, as a client."""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from cli.client import connect
from cli.datasets import create_batch, dataset_body, is_dataset_uri
from jobs.core.settings import Settings
from jobs.core.status import TERMINAL, BatchStatus

JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
PARQUET_SUFFIXES = {".parquet", ".pq"}
HEAD_BYTES = 64  # enough of a file's start to tell its format
FILE_KEY_SUFFIX = ":file"  # the upload's Idempotency-Key is the batch's plus this
# Following a batch's event stream: a read that waits longer than this for a byte (the
# API sends a keep-alive every INFERQ_EVENTS_KEEPALIVE_S, 15 s by default) is a dropped
# connection; a dropped one is resumed up to RECONNECTS times in a row.
STREAM_READ_TIMEOUT_S = 60.0
RECONNECTS = 8


def with_client(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--api-key", envvar="INFERQ_API_KEY", default=None,
                     help="default: the dev key of the data dir")(f)
    return click.option("--api-url", envvar="INFERQ_API_URL", default=None,
                        help="…/v1 base URL (default: the `inferq up` of the data dir)")(f)


def _client(api_url: str | None, api_key: str | None) -> Any:
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
@with_client
def submit(path: str, endpoint: str, model: str | None, metadata: tuple[str, ...],
           service_tier: str | None, idempotency_key: str | None, wait: bool,
           expires_after: int | None, output_expires_after: int | None,
           id_column: str | None, input_column: str | None, template: str | None,
           system: str | None, fmt: str | None, output: str | None,
           api_url: str | None, api_key: str | None) -> None:
    """Create a batch over PATH; prints its id. PATH is a local file (JSONL or Parquet,
    uploaded first) or a dataset in place: s3://bucket/key, a prefix (ending in /) or a
    glob (s3://bucket/reviews/*.parquet), read where it is."""
    meta = parse_metadata(metadata)
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
    client = _client(api_url, api_key)
    if dataset:
        fields = dataset_body(path, endpoint, model, fmt, id_column, input_column, template,
                              system, output)
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
    if model is None and parquet:
        raise click.ClickException("a Parquet input names no model: pass --model "
                                   "(e.g. --model all-MiniLM-L6-v2)")
    body: dict[str, Any] = {}
    if model:
        body["body"] = {"model": model}
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
@with_client
def status(batch_id: str, as_json: bool, watch: bool, api_url: str | None,
           api_key: str | None) -> None:
    """Show a batch: status, counts, errors (each distinct error once, with a count)."""
    client = _client(api_url, api_key)
    b = (follow_events(client, batch_id, to_stderr=as_json) if watch
         else client.batches.retrieve(batch_id))
    if as_json:
        click.echo(b.model_dump_json(indent=2))
        return
    click.echo(summary(b))
    click.echo(f"  endpoint:     {b.endpoint}  model: {_field(b, 'model') or '-'}  "
               f"service tier: {_field(b, 'service_tier') or '-'}")
    if b.metadata:
        click.echo("  metadata:     " + ", ".join(f"{k}={v}" for k, v in b.metadata.items()))
    for name, file_id in (("output file", b.output_file_id), ("error file", b.error_file_id)):
        if file_id:
            click.echo(f"  {name + ':':<13} {file_id}")
    for line in grouped_errors(b):
        click.echo(f"  error:        {line}")


@dataclass(frozen=True)
class StreamEvent:
    """One Server-Sent Event: its id (the last one seen, as the SSE format carries it
    forward), its name and its data."""

    id: str | None
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[StreamEvent]:
    """Events from the lines of a text/event-stream (comments and ``retry:`` skipped)."""
    last_id: str | None = None
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield StreamEvent(last_id, event, "\n".join(data))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            last_id = value
        elif name == "event":
            event = value
        elif name == "data":
            data.append(value)


class _Dropped(Exception):
    """The event stream broke off, or could not be opened again."""


class _Ended(Exception):
    """The batch has ended and the stream's client has seen it end (204)."""


def _open_events(client: Any, batch_id: str, last_id: str | None) -> Any:
    """The event stream's response, its body not read yet (None: the batch has ended and
    the client saw it end). An error status is the SDK's error, as any other call's."""
    import httpx2

    headers = {"Accept": "text/event-stream"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    resp = client.get(f"/batches/{batch_id}/events", cast_to=httpx2.Response, stream=True,
                      options={"headers": headers, "timeout": httpx2.Timeout(
                          STREAM_READ_TIMEOUT_S, connect=10.0)})
    if resp.status_code == 204:
        resp.close()
        return None
    return resp


def _stream(client: Any, batch_id: str, last_id: str | None,
            reconnecting: bool) -> Iterator[StreamEvent]:
    """The events after ``last_id``; _Dropped when the connection broke (or, while
    ``reconnecting``, could not be made), so the caller resumes from its last id."""
    import httpx2
    import openai

    try:
        resp = _open_events(client, batch_id, last_id)
    except (openai.APIConnectionError, openai.InternalServerError) as e:
        if not reconnecting:
            raise  # the API is not there at all: the usual one-line error
        raise _Dropped(str(e)) from None
    if resp is None:
        raise _Ended
    try:
        yield from parse_sse(resp.iter_lines())
    except httpx2.TransportError as e:
        raise _Dropped(str(e) or type(e).__name__) from None
    finally:
        resp.close()


def follow_events(client: Any, batch_id: str, to_stderr: bool = False) -> Any:
    """Follow a batch's event stream with a progress bar (counts, rate, time left) until
    its terminal status; the batch as it ended. Each status change is printed as it
    comes (on stdout, or stderr when stdout is for the batch's JSON); a connection that
    drops (or a stream the API ends after its time limit) is resumed with
    Last-Event-ID, so no change is missed."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    last_id: str | None = None
    drops = 0
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=Console(stderr=to_stderr))
    task = bar.add_task(batch_id, total=None, rate="")
    try:
        while True:
            events = 0
            try:
                for ev in _stream(client, batch_id, last_id, reconnecting=drops > 0):
                    if last_id is None:
                        bar.start()  # shown from the first event: an error is one line alone
                    events, last_id = events + 1, ev.id or last_id
                    try:
                        data = json.loads(ev.data)
                        rc = data["request_counts"]
                        done, line = rc["completed"] + rc["failed"], status_line(data)
                    except (ValueError, KeyError, TypeError):
                        raise click.ClickException(
                            f"unexpected event in the stream of {batch_id}: "
                            f"{ev.data[:120]!r}") from None
                    speed = bar.tasks[0].speed
                    bar.update(task, total=rc["total"] or None, completed=done,
                               description=f"{batch_id} {data['status']}",
                               rate=f"{speed:,.1f} req/s" if speed else "")
                    if ev.event == "status":
                        bar.console.print(line, soft_wrap=True, markup=False, highlight=False)
                        if data["status"] in TERMINAL:
                            return client.batches.retrieve(batch_id)
                # The API ended the stream (its time limit): resume from last_id.
                drops = 0
                if not events:
                    time.sleep(0.5)
                continue
            except _Ended:
                return client.batches.retrieve(batch_id)
            except _Dropped as e:  # resumed from last_id; only drops in a row count
                drops, error = (drops + 1 if not events else 1), str(e)
            if drops > RECONNECTS:
                raise click.ClickException(
                    f"lost the event stream of {batch_id} ({error}) and could not resume "
                    f"it; `inferq status {batch_id} --watch` picks it up again")
            time.sleep(min(0.5 * 2 ** (drops - 1), 5.0))
    finally:
        bar.stop()


def status_line(data: dict[str, Any]) -> str:
    """A status change as ``follow_events`` prints it."""
    rc = data["request_counts"]
    at = time.strftime("%H:%M:%S", time.localtime(data["created_at"]))
    return (f"{data['batch_id']}: {data['status']} at {at} "
            f"({rc['completed'] + rc['failed']} of {rc['total']} requests done)")


@click.command()
@click.argument("batch_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="where to write the output. Its extension follows the content: JSONL for "
                   "a JSONL input, Parquet for a Parquet input (out.jsonl becomes out.parquet "
                   "when the output is Parquet, and the other way round; a name without an "
                   "extension gets one)")
@click.option("--errors", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the error file here (same extension rule)")
@click.option("--merged", is_flag=True,
              help="write each request once with its latest result: the batch's own, or "
                   "that of a rerun of it (`inferq retry`) that ended later; errors included")
@with_client
def results(batch_id: str, output: Path, errors: Path | None, merged: bool,
            api_url: str | None, api_key: str | None) -> None:
    """Download a batch's output (and error) file."""
    if merged and errors is not None:
        raise click.UsageError("--merged writes one file, errors included: leave out --errors")
    client = _client(api_url, api_key)
    b = client.batches.retrieve(batch_id)
    if b.status not in TERMINAL:
        rc = b.request_counts
        done = f"{rc.completed + rc.failed} of {rc.total} requests done" if rc else b.status
        raise click.ClickException(f"batch {batch_id} is still {b.status} ({done}): its "
                                   "results are written when it ends; try again then")
    if merged:
        for path in download_all(client, [(Merged(batch_id), output)]):
            click.echo(f"wrote {path}")
        return
    failed = b.status == BatchStatus.FAILED
    if b.output_file_id is None and b.error_file_id is None:
        raise click.ClickException(failure(b) if failed else
                                   f"batch {batch_id} ended {b.status} with no results")
    wanted = [(b.output_file_id, output)] if b.output_file_id else []
    if errors is not None and b.error_file_id:
        wanted.append((b.error_file_id, errors))
    for path in download_all(client, wanted):
        click.echo(f"wrote {path}")
    if not b.output_file_id:
        click.echo("no output file: no request succeeded", err=True)
    if errors is not None and not b.error_file_id:
        click.echo("no error file: no request failed", err=True)
    if failed:
        click.echo(failure(b), err=True)
        sys.exit(1)


@dataclass(frozen=True)
class Merged:
    """A batch's merged results (``GET /v1/batches/{id}/merged_output``), as a download."""

    batch_id: str


def download_all(client: Any, files: list[tuple[str | Merged, Path]]) -> list[Path]:
    """Download (file id or merged results, destination) pairs, all or nothing; the
    paths written.

    Each file goes to a temporary file beside its destination, all opened before the
    first byte is fetched (a destination that cannot be written fails at once), and
    takes its final name (:func:`fitting_name`) only when every download succeeded.
    A failure leaves no file behind, and its error names the destination given."""
    parts: list[tuple[IO[bytes], Path]] = []
    try:
        for _, dest in files:
            with _about(dest):
                tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")
                parts.append((tmp.open("xb"), tmp))
        finals = []
        for (file_id, dest), (fh, _) in zip(files, parts, strict=True):
            with _about(dest), fh:
                finals.append(fitting_name(dest, parquet=_fetch(client, file_id, fh)))
        for (_, tmp), final in zip(parts, finals, strict=True):
            with _about(final):
                tmp.replace(final)
        return finals
    finally:
        for fh, tmp in parts:
            fh.close()
            tmp.unlink(missing_ok=True)


def _fetch(client: Any, file_id: str | Merged, fh: IO[bytes]) -> bool:
    """Stream a file's content (or a batch's merged results) into ``fh``; whether it is
    Parquet."""
    import httpx2

    from storage.parquet import is_parquet

    head = b""
    with (contextlib.closing(client.get(f"/batches/{file_id.batch_id}/merged_output",
                                        cast_to=httpx2.Response, stream=True))
          if isinstance(file_id, Merged)
          else client.files.with_streaming_response.content(file_id)) as resp:
        chunks = resp.iter_bytes()
        while True:
            try:
                chunk = next(chunks, None)
            except Exception as e:  # the HTTP client's transport errors: the stream broke
                what = (f"the merged results of {file_id.batch_id}"
                        if isinstance(file_id, Merged) else file_id)
                raise click.ClickException(f"the download of {what} broke off ({e}); "
                                           "nothing was written: try again") from None
            if chunk is None:
                break
            if len(head) < HEAD_BYTES:
                head += chunk[:HEAD_BYTES - len(head)]
            fh.write(chunk)
    return is_parquet(head)


@contextlib.contextmanager
def _about(dest: Path) -> Iterator[None]:
    """A file-system error names the destination the user gave, not a temporary file."""
    try:
        yield
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(dest)) from None


def fitting_name(dest: Path, parquet: bool) -> Path:
    want, other = (".parquet", JSONL_SUFFIXES) if parquet else (".jsonl", PARQUET_SUFFIXES)
    suffix = dest.suffix.lower()
    if suffix in other or not suffix:
        return dest.with_name(dest.stem + want if suffix else dest.name + want)
    return dest
