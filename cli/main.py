"""The ``inferq`` command: run the service and talk to it.

Every command finds the stack of its data dir (``INFERQ_DATA_DIR``) through the
state file ``inferq up`` keeps there (``cli.state``); URLs set explicitly win.
A failure the user can fix is one line on stderr and exit status 1 (``cli.errors``).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import click

from cli import admin, batches, capacity, datasets, models, reruns, results, state, top
from cli.state import DATABASE, OBJECT_STORE, REDIS
from jobs.core.lanes import BATCH, FLEX, JOBS, REALTIME
from jobs.core.settings import Settings

if TYPE_CHECKING:
    from cli.stack import Stack
    from cli.stop_signals import StopSignals


class UsageMistake(click.ClickException):
    exit_code = 2


class Commands(click.Group):
    """The command group; the one place that turns errors into one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            where = f" (see `{e.ctx.command_path} --help`)" if e.ctx else ""
            raise UsageMistake(e.format_message() + where) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:
            from cli.errors import user_message

            msg = user_message(e)
            if msg is None:
                raise
            raise click.ClickException(msg) from None


def _settings() -> Settings:
    return Settings.from_env()


def _export(st: Settings) -> None:
    """For commands that exec another program: it reads the resolved settings."""
    os.environ.update({k: v for k, v in st.to_env().items()
                       if k in ("INFERQ_DATABASE_URL", "INFERQ_REDIS_URL",
                                "INFERQ_OBJECT_STORE_URL")})


@click.group(cls=Commands)
def main() -> None:
    """inferq: asynchronous batch inference with an OpenAI-compatible API."""


@main.command()
@click.option("--port", type=int, default=None, help="API port (default INFERQ_API_PORT or 8000)")
@click.option("--workers", "model_workers", type=int, default=1, help="model worker processes")
def up(port: int | None, model_workers: int) -> None:
    """API + workers + embedded backends in one command; Ctrl-C stops everything.

    A child that exits is started again after a backoff (1 s, 2 s, 4 s ... 30 s); one
    that keeps exiting at start stops the stack. Refuses a port in use and a data dir
    another `inferq up` runs on. Workers' metrics are on fixed ports: the API's port + 1
    (the control worker), + 2, ... (the model workers), or from INFERQ_WORKER_METRICS_PORT."""
    from cli.client import local_host
    from cli.stack import Stack, StackError
    from cli.stop_signals import Interrupted, StopSignals

    st = _settings()
    port = port or st.api_port
    lock = state.DataDirLock(st.data_dir)
    if not lock.acquire():
        running = state.read(st.data_dir)
        where = f" (pid {running.pid}, API at {running.api_url})" if running else ""
        raise click.ClickException(
            f"inferq is already running on data dir {st.data_dir}{where}: stop it first, or "
            "set INFERQ_DATA_DIR to another directory")
    signals = StopSignals()
    # Its workers preload the chat model (a worker is live once its engine is built, so
    # the first chat after `up` is ready is served) and keep one metrics port each.
    preload = ({} if "preload_chat_model" in st.model_fields_set
               else {"INFERQ_PRELOAD_CHAT_MODEL": "true"})
    stack = Stack(st, port=port, model_workers=model_workers, stop_signals=signals,
                  extra_env=preload, metrics_port=st.worker_metrics_port or port + 1)
    try:
        signals.install()  # before anything starts: a stop then unwinds to `finally`
        try:
            stack.start()
        except (StackError, TimeoutError) as e:
            raise click.ClickException(f"inferq could not start: {e}") from None
        signals.raising = False  # from here on, _supervise polls signals.received
        url = f"http://{local_host(st.api_host)}:{port}/v1"
        rs = stack.settings
        state.write(st.data_dir, state.StackState(
            pid=os.getpid(), api_url=url, database_url=rs.database_url,
            redis_url=rs.redis_url, object_store_url=rs.object_store_url))
        click.echo(f"inferq is up: {url}")
        click.echo(f"API key:      {stack.api_key}")
        click.echo(f"admin key:    {stack.admin_key}  (OPENAI_ADMIN_KEY for the SDK's admin "
                   "client; the projects, keys, limits and usage commands use it)")
        click.echo(f"metrics token: {stack.settings.metrics_token}  (the API's /metrics: "
                   "'Authorization: Bearer <token>', or the admin key)")
        click.echo(f"data dir:     {st.data_dir}  (logs in {stack.log_dir})")
        scraped = stack.metrics_urls()
        click.echo(f"metrics ({len(scraped)} processes):")
        for name, murl in scraped.items():
            click.echo(f"  {name}: {murl}")
        failed = _supervise(stack, signals)
        if failed:
            raise click.ClickException(f"{failed}; stopped everything")
    except Interrupted as e:
        click.echo(f"interrupted by {e} while starting", err=True)
        raise click.exceptions.Exit(128 + e.signum) from None
    finally:
        signals.raising = False  # a second signal must not interrupt the cleanup
        click.echo("stopping…")
        state.remove(st.data_dir, os.getpid())
        stack.stop()
        lock.release()


def _supervise(stack: Stack, signals: StopSignals) -> str | None:
    """Wait for Ctrl-C / SIGTERM (None), starting again each child that exits, after a
    backoff (``cli.supervisor``); a child that keeps exiting at start stops the stack
    (what happened)."""
    from cli.supervisor import ChildCrashLoop, Supervisor

    def say(message: str) -> None:
        click.echo(f"{time.strftime('%H:%M:%S')} {message}", err=True)

    supervisor = Supervisor(stack.procs, stack.respawn, stack.log_path, say, ready=stack.ready)
    while signals.received is None:
        try:
            supervisor.poll()
        except ChildCrashLoop as e:
            return str(e)
        time.sleep(0.5)
    return None


@main.command()
@click.option("--port", type=int, default=None)
def api(port: int | None) -> None:
    """Serve the HTTP API with gunicorn (one gevent process; INFERQ_API_MAX_CONNECTIONS
    and the other INFERQ_API_* settings bound what it holds)."""
    from cli.command_lines import api_command

    st = state.backends(DATABASE, REDIS, OBJECT_STORE)
    _export(st)
    cmd = api_command(st.api_host, port or st.api_port, st.api_max_connections,
                      st.api_keepalive_s)
    os.execv(cmd[0], cmd)


@main.command()
@click.option("--lanes", default=None, show_default="realtime,jobs,batch (flex with --spot)",
              help="comma-separated: realtime, jobs, batch, flex, control")
@click.option("--name", default=None, help="worker name (default: the lanes)")
@click.option("--spot", is_flag=True, help="preemptible: on SIGTERM finish the current chunk "
              "within INFERQ_SPOT_NOTICE_S, commit it and hand the shard back")
def worker(lanes: str | None, name: str | None, spot: bool) -> None:
    """Run a Celery worker for the given lanes (one process per accelerator)."""
    from cli.command_lines import worker_command

    _export(state.backends(DATABASE, REDIS, OBJECT_STORE))
    lanes = lanes or (FLEX if spot else ",".join((REALTIME, JOBS, BATCH)))
    os.environ["INFERQ_LANES"] = lanes
    if spot:  # SIGTERM: commit the chunk in flight, hand back; cold shutdown after the notice
        os.environ["INFERQ_SPOT"] = "1"
    cmd = worker_command(lanes, name or lanes.replace(",", "-"))
    os.execv(cmd[0], cmd)


@main.command()
@click.option("--import-models", is_flag=True,
              help="also import the builtin models this configuration serves "
              "(INFERQ_EMBEDDING_MODEL, INFERQ_CHAT_MODEL) that are not registered yet: "
              "needs torch and their packages, as the worker images have")
def migrate(import_models: bool) -> None:
    """Apply database migrations (alembic upgrade head) and register the builtin models
    that ship ready to serve (their files go to the object store)."""
    from jobs.core.context import Context
    from jobs.fleet import builtin_models
    from storage.db import migrate as run

    st = state.backends(DATABASE, OBJECT_STORE)
    run(st.database_url)
    ctx = Context(st)
    try:
        builtin_models.register_builtin_models(ctx)
        click.echo("database is at the latest revision")
        if import_models:
            models.import_builtins(ctx, builtin_models.missing_builtins(ctx), force=False)
    finally:
        ctx.close()


main.add_command(admin.admin_key_command)
main.add_command(admin.projects)
admin.projects.add_command(datasets.locations)
main.add_command(admin.keys)
main.add_command(admin.limits)
main.add_command(admin.usage)
main.add_command(models.models)
main.add_command(batches.submit)
main.add_command(batches.status)
main.add_command(results.results)
main.add_command(reruns.retry)
main.add_command(capacity.capacity)
main.add_command(top.top)


if __name__ == "__main__":
    main()
