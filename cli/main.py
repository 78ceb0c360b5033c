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

from cli import admin, batches, capacity, datasets, reruns, state, top
from cli.state import DATABASE, OBJECT_STORE, REDIS
from jobs.core.settings import Settings

if TYPE_CHECKING:
    from cli.stack import Stack, StopSignals


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
    another `inferq up` runs on."""
    from cli.client import local_host
    from cli.stack import Interrupted, Stack, StackError, StopSignals

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
    stack = Stack(st, port=port, model_workers=model_workers, stop_signals=signals)
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

    supervisor = Supervisor(stack.procs, stack.respawn, stack.log_path, say)
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
    from cli.stack import api_command

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
    from cli.stack import worker_command

    _export(state.backends(DATABASE, REDIS, OBJECT_STORE))
    lanes = lanes or ("flex" if spot else "realtime,jobs,batch")
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
    from jobs.fleet import registry
    from storage.db import migrate as run

    st = state.backends(DATABASE, OBJECT_STORE)
    run(st.database_url)
    ctx = Context(st)
    try:
        registry.register_builtin_models(ctx)
        click.echo("database is at the latest revision")
        if import_models:
            _import_builtins(ctx, registry.missing_builtins(ctx), force=False)
    finally:
        ctx.close()


def _import_builtins(ctx: Any, names: list[str], force: bool) -> None:
    """Import the builtin models ``names`` (their packages must be installed)."""
    from jobs.fleet import registry

    for name in names:
        from workers.models.importers import import_model  # torch: only when importing

        t0 = time.perf_counter()
        try:
            m = import_model(ctx, name, force=force)
        except (ImportError, ValueError, OSError) as e:
            raise click.ClickException(f"{name}: could not be imported: {e}") from None
        click.echo(f"{name}: imported version {m.version} ({len(m.files)} files, "
                   f"{registry.total_bytes(m) / 1e6:.1f} MB) in "
                   f"{time.perf_counter() - t0:.1f} s")


@main.group()
def models() -> None:
    """The model registry and repository."""


@models.command("import")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="import again even when already registered")
def models_import(names: tuple[str, ...], force: bool) -> None:
    """Import builtin models NAMES (default: all) into the model repository."""
    from jobs.core.context import Context
    from jobs.fleet import registry

    unknown = [n for n in names if n not in registry.BUILTIN]
    if unknown:
        raise click.UsageError(f"unknown model(s): {', '.join(unknown)} "
                               f"(builtin: {', '.join(registry.BUILTIN)})")
    ctx = Context(state.backends(DATABASE, OBJECT_STORE))
    try:
        todo = []
        for name in names or tuple(registry.BUILTIN):
            have = registry.get_default(ctx, name)
            if have is not None and not force:
                click.echo(f"{name}: version {have.version} already registered; skipped")
            else:
                todo.append(name)
        _import_builtins(ctx, todo, force)
    finally:
        ctx.close()


@models.command("add")
@click.argument("name")
@click.argument("path")
@click.option("--kind", type=click.Choice(["embeddings", "chat", "completions"]),
              required=True, help="completions: a generation model without a chat template")
@click.option("--version", "version", help="the version's name (default: the next number)")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16", "int8"]),
              default="fp32", show_default=True, help="bf16/fp16: GPU workers; int8: CPU workers")
@click.option("--engine", type=click.Choice(["auto", "transformers", "vllm"]), default="auto",
              show_default=True, help="the generation engine; auto: vLLM where the worker "
              "has it and it serves the architecture, else transformers")
@click.option("--default", "make_default", is_flag=True,
              help="serve it under the bare NAME from now on (a name's first version is)")
@click.option("--allow-pickle", is_flag=True,
              help="publish pickled weights (.bin, .pt): loading them runs their code")
@click.option("--matryoshka", is_flag=True,
              help="an embeddings model trained for shortened vectors (a Matryoshka loss): "
              "it serves `dimensions`")
def models_add(name: str, path: str, kind: str, version: str | None, precision: str,
               engine: str, make_default: bool, allow_pickle: bool, matryoshka: bool) -> None:
    """Publish your own model as a version of NAME: PATH is a local folder or an
    object-store URI s3://bucket/prefix/ (read with this deployment's object-store
    credentials). The folder is checked first; nothing is uploaded if it is refused."""
    from jobs.core.context import Context
    from jobs.core.errors import InferqError
    from jobs.fleet import folders

    ctx = Context(state.backends(DATABASE, OBJECT_STORE))
    try:
        t0 = time.perf_counter()
        added = folders.add(ctx, name, path, kind, version, precision, make_default,
                            allow_pickle, engine, matryoshka)
    except InferqError as e:
        raise click.ClickException(e.message) from None
    finally:
        ctx.close()
    from jobs.fleet import registry

    m = added.model
    engine = (("matryoshka, " if m.matryoshka else "") if kind == "embeddings"
              else f"engine {m.engine}, ")
    click.echo(f"{name}: version {m.version} registered ({kind}, {m.precision}, {engine}context "
               f"{m.context_length}, {len(m.files)} files, "
               f"{registry.total_bytes(m) / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s"
               f"{'; the default' if m.is_default else ''}")
    for note in added.notes:
        click.echo(note)


@models.command("remove")
@click.argument("name")
@click.argument("version")
def models_remove(name: str, version: str) -> None:
    """Retire NAME's VERSION: its registry row and its files. Refused while it is the
    default of a name with other versions, has a canary, shadow or warm pool, shares its
    files with a derived version, or a batch or job not finished names it."""
    from jobs.core.context import Context
    from jobs.core.errors import InferqError
    from jobs.fleet import retire

    st = state.backends(DATABASE, OBJECT_STORE)  # live workers unload it when Redis is known
    ctx = Context(st)
    try:
        got = retire.remove(ctx, name, version, unload=bool(st.redis_url))
    except InferqError as e:
        raise click.ClickException(e.message) from None
    finally:
        ctx.close()
    where = f"; unloaded on {', '.join(got.unloaded_on)}" if got.unloaded_on else ""
    files = f"{got.files_deleted} objects deleted" if got.files_deleted else "its files kept"
    click.echo(f"{name}: version {version} removed ({files}){where}")


@models.command("list")
def models_list() -> None:
    """List registered model versions (* marks the default of each name), their traffic
    share and the live workers holding each."""
    from jobs.core.context import Context
    from jobs.fleet import placement, registry

    st = state.backends(DATABASE)  # residency when Redis is known too
    ctx = Context(st)
    try:
        rows = registry.all_versions(ctx)
        where = _quietly(lambda: placement.where(ctx.redis), {}) if st.redis_url else {}
        loads = _quietly(lambda: placement.load_counts(ctx.redis), {}) if st.redis_url else {}
    finally:
        ctx.close()
    if not rows:
        click.echo("no models registered (run: inferq models import)")
        return
    canary = {n: sum(m.traffic_weight for m in rows if m.name == n and not m.is_default)
              for n in {m.name for m in rows}}
    click.echo(f"  {'NAME':<28} {'VERSION':<8} {'KIND':<11} {'PRECISION':<9} {'ENGINE':<12} "
               f"{'CONTEXT':>7} "
               f"{'SIZE':>10} {'TRAFFIC':>7} {'LOADS':>5}  RESIDENT ON")
    for m in rows:
        ref = registry.ref(m.name, m.version)
        share = max(0.0, 1 - canary[m.name]) if m.is_default else m.traffic_weight
        traffic = f"{share:.0%}" + (f"+{m.shadow_share:.0%}s" if m.shadow_share else "")
        click.echo(f"{'*' if m.is_default else ' '} {m.name:<28} {m.version:<8} {m.kind:<11} "
                   f"{m.precision:<9} {m.engine:<12} {m.context_length:>7} "
                   f"{registry.total_bytes(m) / 1e6:>8.1f}MB {traffic:>7} "
                   f"{sum(loads.get(ref, {}).values()):>5}  "
                   f"{', '.join(where.get(ref, [])) or '-'}")


def _quietly(read: Any, default: Any) -> Any:
    """What Redis says (the fleet's residency), or ``default`` when it cannot be asked."""
    import redis

    try:
        return read()
    except redis.RedisError:
        return default


@models.command("rollout")
@click.argument("name")
@click.option("--version", "version", help="the version the step is for")
@click.option("--weight", type=click.FloatRange(0, 100),
              help="percent of NAME's realtime requests and jobs VERSION takes (a canary)")
@click.option("--shadow", type=click.FloatRange(0, 100),
              help="percent of the default version's realtime requests mirrored to VERSION")
@click.option("--promote", is_flag=True, help="VERSION becomes the default, taking all traffic")
@click.option("--rollback", is_flag=True,
              help="stop new traffic to VERSION (every canary and shadow of NAME without one)")
def models_rollout(name: str, version: str | None, weight: float | None,
                   shadow: float | None, promote: bool, rollback: bool) -> None:
    """Roll a version of NAME out: a canary weight, a shadow share, promote or roll back.
    Without a step, shows the rollout: traffic, residency and the shadow report."""
    from jobs.core.context import Context
    from jobs.core.errors import InferqError
    from jobs.fleet import rollout

    ctx = Context(state.backends(DATABASE, REDIS))
    try:
        if weight is None and shadow is None and not promote and not rollback:
            got = rollout.status(ctx, name)
        else:
            got = rollout.change(ctx, name, version,
                                 None if weight is None else weight / 100,
                                 None if shadow is None else shadow / 100,
                                 promote=promote, rollback=rollback)
    except InferqError as e:
        raise click.ClickException(e.message) from None
    finally:
        ctx.close()
    _show_rollout(got)


@models.command("pool")
@click.argument("name")
@click.argument("version")
@click.option("--min", "min_resident", type=click.IntRange(0), help="copies kept resident")
@click.option("--idle-unload", "idle_unload_s", type=click.IntRange(1),
              help="seconds unused after which an extra copy is unloaded")
@click.option("--keep", is_flag=True, help="never unload extra copies for idleness")
def models_pool(name: str, version: str, min_resident: int | None,
                idle_unload_s: int | None, keep: bool) -> None:
    """The warm pool of NAME's VERSION: copies kept resident on live workers (also
    after restarts and scale-in) and when extra copies are unloaded."""
    from jobs.core.context import Context
    from jobs.core.errors import InferqError
    from jobs.fleet import rollout

    if keep and idle_unload_s is not None:
        raise click.UsageError("--keep and --idle-unload exclude each other")
    if min_resident is None and idle_unload_s is None and not keep:
        raise click.UsageError("give --min, --idle-unload or --keep")
    ctx = Context(state.backends(DATABASE, REDIS))
    try:
        got = rollout.set_pool(ctx, name, version, min_resident, idle_unload_s, keep)
    except InferqError as e:
        raise click.ClickException(e.message) from None
    finally:
        ctx.close()
    _show_rollout(got)


def _show_rollout(got: dict[str, Any]) -> None:
    click.echo(f"{got['name']}:")
    click.echo(f"  {'VERSION':<10} {'TRAFFIC':>7} {'SHADOW':>6} {'POOL':>4} {'IDLE':>6}  "
               "RESIDENT ON")
    for v in got["versions"]:
        idle = f"{v['idle_unload_s']}s" if v["idle_unload_s"] else "-"
        click.echo(f"{'*' if v['default'] else ' '} {v['version']:<10} "
                   f"{v['traffic_weight']:>7.1%} {v['shadow_share']:>6.0%} "
                   f"{v['min_resident']:>4} {idle:>6}  {', '.join(v['resident_on']) or '-'}")
    if got["shadow"]:
        click.echo("  shadow report (agreement: cosine for embeddings, exact match for chat):")
        for r in got["shadow"]:
            agree = "-" if r["agreement"] is None else f"{r['agreement']:.4f}"
            p50 = "-" if r["latency_p50_s"] is None else f"{r['latency_p50_s'] * 1e3:.1f}ms"
            p99 = "-" if r["latency_p99_s"] is None else f"{r['latency_p99_s'] * 1e3:.1f}ms"
            click.echo(f"    {r['version']:<10} primary {r['primary']:>6}  shadow "
                       f"{r['shadow']:>6}  errors {r['errors']:>4}  agreement {agree:>7}  "
                       f"p50 {p50:>9}  p99 {p99:>9}")


@models.command("derive")
@click.argument("name")
@click.option("--from", "base", required=True, help="the version whose files it serves")
@click.option("--version", "version", required=True, help="the new version's name")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16", "int8"]),
              required=True, help="bf16/fp16: GPU workers; int8: CPU workers")
@click.option("--default", "make_default", is_flag=True,
              help="serve it under the bare name from now on")
def models_derive(name: str, base: str, version: str, precision: str,
                  make_default: bool) -> None:
    """Register a version of NAME that serves the files of another in PRECISION."""
    from jobs.core.context import Context
    from jobs.fleet import registry

    ctx = Context(state.backends(DATABASE))
    try:
        m = registry.derive(ctx, name, base, version, precision, make_default)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    finally:
        ctx.close()
    click.echo(f"{name}: version {m.version} registered ({m.precision}, the files of "
               f"{base}){'; now the default' if m.is_default else ''}")


@models.command("default")
@click.argument("name")
@click.argument("version")
def models_default(name: str, version: str) -> None:
    """Serve VERSION under the bare NAME: all of its traffic (a live worker loads it
    on the first request, if none holds it). Batches keep the version they started on."""
    from jobs.core.context import Context
    from jobs.fleet import registry

    ctx = Context(state.backends(DATABASE))
    try:
        m = registry.set_default(ctx, name, version)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    finally:
        ctx.close()
    click.echo(f"{name}: version {m.version} ({m.precision}) is the default")


main.add_command(admin.admin_key_command)
main.add_command(admin.projects)
admin.projects.add_command(datasets.locations)
main.add_command(admin.keys)
main.add_command(admin.limits)
main.add_command(admin.usage)
main.add_command(batches.submit)
main.add_command(batches.status)
main.add_command(batches.results)
main.add_command(reruns.retry)
main.add_command(capacity.capacity)
main.add_command(top.top)


if __name__ == "__main__":
    main()
