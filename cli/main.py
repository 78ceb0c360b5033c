"""The ``inferq`` command: run the service and talk to it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from jobs.settings import Settings


def _settings() -> Settings:
    return Settings.from_env()


@click.group()
def main() -> None:
    """inferq: asynchronous batch inference with an OpenAI-compatible API."""


@main.command()
@click.option("--port", type=int, default=None, help="API port (default INFERQ_API_PORT or 8000)")
@click.option("--workers", "model_workers", type=int, default=1, help="model worker processes")
def up(port: int | None, model_workers: int) -> None:
    """API + workers + embedded backends in one command; Ctrl-C stops everything."""
    from cli.stack import Stack

    stack = Stack(_settings(), port=port, model_workers=model_workers)
    stopping = []

    def _stop(*_: Any) -> None:
        stopping.append(True)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        stack.start()
        click.echo(f"inferq is up: {stack.base_url}/v1")
        click.echo(f"API key:      {stack.api_key}")
        click.echo(f"data dir:     {stack.settings.data_dir}  (logs in {stack.log_dir})")
        while not stopping:
            for name, p in stack.procs.items():
                if p.poll() is not None:
                    click.echo(f"{name} exited ({p.returncode}); stopping", err=True)
                    stopping.append(True)
            time.sleep(0.5)
    finally:
        click.echo("stopping…")
        stack.stop()


@main.command()
@click.option("--port", type=int, default=None)
@click.option("--threads", type=int, default=64, help="concurrent requests (streams included)")
def api(port: int | None, threads: int) -> None:
    """Serve the HTTP API with gunicorn."""
    from cli.stack import api_command

    st = _settings()
    cmd = api_command(st.api_host, port or st.api_port, threads)
    os.execv(cmd[0], cmd)


@main.command()
@click.option("--lanes", default=None, show_default="realtime,jobs,batch (flex with --spot)",
              help="comma-separated: realtime, jobs, batch, flex, control")
@click.option("--name", default=None, help="worker name (default: the lanes)")
@click.option("--spot", is_flag=True, help="preemptible: on SIGTERM finish the current chunk "
              "within INFERQ_SPOT_NOTICE_S, commit it and hand the shard back")
def worker(lanes: str | None, name: str | None, spot: bool) -> None:
    """Run a Celery worker for the given lanes (one process per accelerator)."""
    from cli.stack import worker_command

    lanes = lanes or ("flex" if spot else "realtime,jobs,batch")
    os.environ["INFERQ_LANES"] = lanes
    if spot:  # SIGTERM: commit the chunk in flight, hand back; cold shutdown after the notice
        os.environ["INFERQ_SPOT"] = "1"
    cmd = worker_command(lanes, name or lanes.replace(",", "-"))
    os.execv(cmd[0], cmd)


@main.command()
def migrate() -> None:
    """Apply database migrations (alembic upgrade head)."""
    from jobs import service
    from jobs.context import Context
    from storage.db import migrate as run

    st = _settings()
    run(st.database_url)
    service.register_builtin_models(Context(st))
    click.echo("database is at the latest revision")


@main.command("create-key")
@click.argument("tenant")
def create_key(tenant: str) -> None:
    """Create a tenant (if new) and print a new API key for it."""
    from jobs import service
    from jobs.context import Context

    _, key = service.create_tenant(Context(_settings()), tenant)
    click.echo(key)


@main.group()
def models() -> None:
    """The model registry and repository."""


@models.command("import")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="import again even when already registered")
def models_import(names: tuple[str, ...], force: bool) -> None:
    """Import builtin models NAMES (default: all) into the model repository."""
    from jobs import registry
    from jobs.context import Context

    unknown = [n for n in names if n not in registry.BUILTIN]
    if unknown:
        raise click.UsageError(f"unknown model(s): {', '.join(unknown)} "
                               f"(builtin: {', '.join(registry.BUILTIN)})")
    ctx = Context(_settings())
    try:
        for name in names or tuple(registry.BUILTIN):
            have = registry.get_default(ctx, name)
            if have is not None and not force:
                click.echo(f"{name}: version {have.version} already registered; skipped")
                continue
            from workers.runtime.importers import import_model  # torch: only when importing

            t0 = time.perf_counter()
            m = import_model(ctx, name, force=force)
            click.echo(f"{name}: imported version {m.version} ({len(m.files)} files, "
                       f"{registry.total_bytes(m) / 1e6:.1f} MB) in "
                       f"{time.perf_counter() - t0:.1f} s")
    finally:
        ctx.close()


@models.command("list")
def models_list() -> None:
    """List registered model versions (* marks the default of each name)."""
    from jobs import registry
    from jobs.context import Context

    ctx = Context(_settings())
    try:
        rows = registry.all_versions(ctx)
    finally:
        ctx.close()
    if not rows:
        click.echo("no models registered (run: inferq models import)")
        return
    click.echo(f"  {'NAME':<28} {'VERSION':<8} {'KIND':<11} {'CONTEXT':>7} {'SIZE':>10}  SOURCE")
    for m in rows:
        click.echo(f"{'*' if m.is_default else ' '} {m.name:<28} {m.version:<8} {m.kind:<11} "
                   f"{m.context_length:>7} {registry.total_bytes(m) / 1e6:>8.1f}MB  {m.source}")


# Client commands ----------------------------------------------------------------------


def _client(api_url: str | None, api_key: str | None) -> Any:
    from openai import OpenAI

    st = _settings()
    key = api_key or _read(st.data_dir / "dev-api-key")
    if not key:
        raise click.UsageError("no API key: pass --api-key or set INFERQ_API_KEY")
    return OpenAI(base_url=api_url or f"http://127.0.0.1:{st.api_port}/v1", api_key=key)


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


client_opts = [
    click.option("--api-url", envvar="INFERQ_API_URL", default=None, help="…/v1 base URL"),
    click.option("--api-key", envvar="INFERQ_API_KEY", default=None),
]


def with_client(f: Any) -> Any:
    for opt in reversed(client_opts):
        f = opt(f)
    return f


@main.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--endpoint", default="/v1/embeddings", show_default=True)
@click.option("--model", default=None, help="model for Parquet inputs")
@click.option("--wait/--no-wait", default=False, help="follow progress until done")
@with_client
def submit(path: Path, endpoint: str, model: str | None, wait: bool, api_url: str | None,
           api_key: str | None) -> None:
    """Upload PATH (JSONL or Parquet) and create a batch."""
    from cli.mainent import follow

    client = _client(api_url, api_key)
    with path.open("rb") as fh:
        f = client.files.create(file=(path.name, fh), purpose="batch")
    extra = {"body": {"model": model}} if model else None
    b = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h",
                              extra_body=extra)
    click.echo(b.id)
    if wait:
        b = follow(client, b.id)
        click.echo(f"{b.id}: {b.status} ({b.request_counts.completed} completed, "
                   f"{b.request_counts.failed} failed)")
        sys.exit(0 if b.status == "completed" else 1)


@main.command()
@click.argument("batch_id")
@with_client
def status(batch_id: str, api_url: str | None, api_key: str | None) -> None:
    """Show a batch."""
    b = _client(api_url, api_key).batches.retrieve(batch_id)
    click.echo(b.model_dump_json(indent=2))


@main.command()
@click.argument("batch_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--errors", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the error file here")
@with_client
def results(batch_id: str, output: Path, errors: Path | None, api_url: str | None,
            api_key: str | None) -> None:
    """Download a batch's output (and error) file."""
    client = _client(api_url, api_key)
    b = client.batches.retrieve(batch_id)
    if b.output_file_id is None and b.error_file_id is None:
        raise click.ClickException(f"batch {batch_id} has no results yet (status {b.status})")
    for file_id, dest in ((b.output_file_id, output), (b.error_file_id, errors)):
        if file_id and dest:
            client.files.content(file_id).write_to_file(dest)
            click.echo(f"wrote {dest}")


if __name__ == "__main__":
    main()
