"""``inferq results``: a batch's output and error files (or its merged results)
downloaded, all or nothing, under names whose extension follows their content."""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from cli.batches import HEAD_BYTES, api_client, failure, with_client
from jobs.core.status import TERMINAL, BatchStatus

JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
PARQUET_SUFFIXES = {".parquet", ".pq"}


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
    client = api_client(api_url, api_key)
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
