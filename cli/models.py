"""``inferq models``: the model registry and repository. Import the builtin models,
publish your own, list them, roll a version out (canary, shadow, promote, roll back),
keep warm pools, derive a version in another precision and pick a name's default."""

from __future__ import annotations

import time
from typing import Any

import click

from cli import state
from cli.state import DATABASE, OBJECT_STORE, REDIS
from jobs.core import refs


def import_builtins(ctx: Any, names: list[str], force: bool) -> None:
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


@click.group()
def models() -> None:
    """The model registry and repository."""


@models.command("import")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="import again even when already registered")
def models_import(names: tuple[str, ...], force: bool) -> None:
    """Import builtin models NAMES (default: all) into the model repository."""
    from jobs.core.context import Context
    from jobs.fleet import builtin_models, registry

    unknown = [n for n in names if n not in builtin_models.BUILTIN]
    if unknown:
        raise click.UsageError(f"unknown model(s): {', '.join(unknown)} "
                               f"(builtin: {', '.join(builtin_models.BUILTIN)})")
    ctx = Context(state.backends(DATABASE, OBJECT_STORE))
    try:
        todo = []
        for name in names or tuple(builtin_models.BUILTIN):
            have = registry.get_default(ctx, name)
            if have is not None and not force:
                click.echo(f"{name}: version {have.version} already registered; skipped")
            else:
                todo.append(name)
        import_builtins(ctx, todo, force)
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
    from jobs.fleet import own_models

    ctx = Context(state.backends(DATABASE, OBJECT_STORE))
    try:
        t0 = time.perf_counter()
        added = own_models.add(ctx, name, path, kind, version, precision, make_default,
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
        ref = refs.model_ref(m.name, m.version)
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
            got = rollout.status(ctx, name).body()
        else:
            got = rollout.change(ctx, name, version,
                                 None if weight is None else weight / 100,
                                 None if shadow is None else shadow / 100,
                                 promote=promote, rollback=rollback).body()
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
        got = rollout.set_pool(ctx, name, version, min_resident, idle_unload_s, keep).body()
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
