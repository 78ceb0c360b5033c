"""``inferq projects``, ``keys``, ``limits`` and ``usage``: the Admin API through the
openai SDK's admin client, with the admin key of the data dir (or ``--admin-key`` /
``INFERQ_ADMIN_KEY``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import click

from cli import state
from cli.client import api_url_option, connect_admin
from jobs.core.settings import Settings
from jobs.tenants import auth

NAME_MAX = 200
LIMIT_OPTIONS = {  # option -> the rate limit's field
    "rpm": "max_requests_per_1_minute", "tpm": "max_tokens_per_1_minute",
    "rpd": "max_requests_per_1_day", "batch_tokens_per_day": "batch_1_day_max_input_tokens",
    "max_streams": "max_concurrent_streams",
    "max_request_tokens": "max_tokens_per_realtime_request"}
GROUPS = ("project_id", "api_key_id", "model", "batch", "service_tier")
COST_GROUPS = ("project_id", "api_key_id", "line_item")
EMBEDDING_GROUPS = ("project_id", "api_key_id", "model")
_AGO = re.compile(r"(\d+)([mhd])")


def with_admin(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--admin-key", envvar="INFERQ_ADMIN_KEY", default=None,
                     help="default: the admin key of the data dir")(f)
    return api_url_option(f)


def _admin(api_url: str | None, admin_key: str | None) -> Any:
    return connect_admin(Settings.from_env(), api_url, admin_key).admin.organization


def check_name(name: str, hint: str = "NAME") -> str:
    if not name.strip() or len(name) > NAME_MAX or not name.isprintable():
        raise click.BadParameter(f"a name is 1 to {NAME_MAX} printable characters",
                                 param_hint=hint)
    return name


def table(headers: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """Left-aligned columns as wide as their widest cell (nothing is cut short)."""
    cells = [[str(c) for c in headers]] + [["-" if c is None else str(c) for c in r]
                                           for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def when(ts: int | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


def parse_time(value: str, param: str) -> int:
    """Epoch seconds, an ISO 8601 date or time (UTC unless it says otherwise), or an
    age: ``30m``, ``24h``, ``7d`` ago."""
    if value.isdigit():
        return int(value)
    if m := _AGO.fullmatch(value):
        return int(time.time()) - int(m[1]) * {"m": 60, "h": 3600, "d": 86400}[m[2]]
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not epoch seconds, an ISO 8601 date or "
                                 "time, or an age such as 24h or 7d",
                                 param_hint=param) from None
    return int((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp())


class LimitValue(click.ParamType):
    """A number (0: no limit), or ``none`` (the project's value is cleared: the
    deployment's default applies)."""

    name = "N|none"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | None:
        if isinstance(value, int) or value is None:
            return value
        if str(value).lower() == "none":
            return None
        if not str(value).isdigit() or int(value) >= 2**63:
            self.fail(f"{value!r} is not a number (0: no limit) or 'none' (the "
                      "deployment's default)", param, ctx)
        return int(value)


@click.command("admin-key")
@click.option("--name", default="cli", show_default=True, help="what the key is for")
def admin_key_command(name: str) -> None:
    """Create an admin key in the database and print it (shown once): for a deployment
    without `inferq up`, which makes one itself."""
    from jobs.core.context import Context

    ctx = Context(state.backends(state.DATABASE))
    try:
        click.echo(auth.create_admin_key(ctx, check_name(name, "--name")))
    finally:
        ctx.close()


# projects ---------------------------------------------------------------------------------


@click.group()
def projects() -> None:
    """Projects: each has its own files, batches, jobs, keys, limits and usage."""


@projects.command("create")
@click.argument("name")
@click.option("--weight", type=click.IntRange(1, 10_000), default=None,
              help="its share of the batch lanes against other projects (default 1)")
@with_admin
def projects_create(name: str, weight: int | None, api_url: str | None,
                    admin_key: str | None) -> None:
    """Create project NAME; prints its id."""
    name = check_name(name)
    extra = {"weight": weight} if weight is not None else None
    p = _admin(api_url, admin_key).projects.create(name=name, extra_body=extra)
    click.echo(p.id)


@projects.command("list")
@click.option("--all", "include_archived", is_flag=True, help="archived projects too")
@with_admin
def projects_list(include_archived: bool, api_url: str | None, admin_key: str | None) -> None:
    """List projects, oldest first."""
    rows = _admin(api_url, admin_key).projects.list(include_archived=include_archived,
                                                     limit=100)
    click.echo(table(("ID", "NAME", "STATUS", "WEIGHT", "CREATED"),
                     ((p.id, p.name, p.status, getattr(p, "weight", None), when(p.created_at))
                      for p in rows)))


@projects.command("update")
@click.argument("project_id")
@click.option("--name", default=None)
@click.option("--weight", type=click.IntRange(1, 10_000), default=None)
@with_admin
def projects_update(project_id: str, name: str | None, weight: int | None,
                    api_url: str | None, admin_key: str | None) -> None:
    """Rename a project or change its weight."""
    if name is None and weight is None:
        raise click.UsageError("give --name or --weight")
    fields = {"name": check_name(name, "--name")} if name is not None else {}
    p = _admin(api_url, admin_key).projects.update(
        project_id, **fields, extra_body={"weight": weight} if weight is not None else None)
    click.echo(f"{p.id} {p.name} (weight {getattr(p, 'weight', None)})")


@projects.command("archive")
@click.argument("project_id")
@with_admin
def projects_archive(project_id: str, api_url: str | None, admin_key: str | None) -> None:
    """Archive a project: its keys are refused from then on."""
    p = _admin(api_url, admin_key).projects.archive(project_id)
    click.echo(f"{p.id} archived")


# keys ------------------------------------------------------------------------------------------


@click.group()
def keys() -> None:
    """A project's API keys (each owned by a service account)."""


@keys.command("create")
@click.option("--project", "project_id", required=True)
@click.option("--name", default="cli", show_default=True,
              help="the service account (and key) name")
@click.option("--expires-in", type=click.IntRange(1, 100 * 365 * 86400), default=None,
              help="seconds until the key expires (default: never)")
@with_admin
def keys_create(project_id: str, name: str, expires_in: int | None, api_url: str | None,
                admin_key: str | None) -> None:
    """Create a service account and its key; prints the key (shown this once)."""
    name = check_name(name, "--name")
    sa = _admin(api_url, admin_key).projects.service_accounts.create(
        project_id, name=name, expires_in_seconds=expires_in)
    click.echo(sa.api_key.value)
    click.echo(f"key {sa.api_key.id} of service account {sa.id}; the key is shown only "
               "this once", err=True)


@keys.command("list")
@click.option("--project", "project_id", required=True)
@with_admin
def keys_list(project_id: str, api_url: str | None, admin_key: str | None) -> None:
    """List a project's keys (not their values)."""
    rows = _admin(api_url, admin_key).projects.api_keys.list(project_id, limit=100)
    click.echo(table(("ID", "NAME", "KEY", "OWNER", "ACCESS", "CREATED", "LAST USED"), (
        (k.id, k.name, k.redacted_value,
         k.owner.service_account.id if k.owner.service_account else None,
         k.owner_project_access, when(k.created_at), when(k.last_used_at)) for k in rows)))


@keys.command("revoke")
@click.option("--project", "project_id", required=True)
@click.argument("key_id")
@with_admin
def keys_revoke(project_id: str, key_id: str, api_url: str | None,
                admin_key: str | None) -> None:
    """Revoke a key: refused from the next request on."""
    _admin(api_url, admin_key).projects.api_keys.delete(key_id, project_id=project_id)
    click.echo(f"{key_id} revoked")


# limits --------------------------------------------------------------------------------------


@click.group()
def limits() -> None:
    """A project's rate limits, per model."""


def _limit_rows(rows: Iterable[Any]) -> str:
    """No limit shows as "-" (the API reports none per minute as a huge number, which
    OpenAI's shape requires)."""
    unlimited = Settings.from_env().rate_limit_unlimited

    def shown(v: int | None) -> int | None:
        return None if v is None or v >= unlimited else v

    return table(("MODEL", "RPM", "TPM", "RPD", "BATCH TOKENS/DAY", "STREAMS",
                  "REQUEST TOKENS"), (
        (r.model, shown(r.max_requests_per_1_minute), shown(r.max_tokens_per_1_minute),
         shown(r.max_requests_per_1_day), shown(r.batch_1_day_max_input_tokens),
         shown(getattr(r, "max_concurrent_streams", None)),
         shown(getattr(r, "max_tokens_per_realtime_request", None))) for r in rows))


@limits.command("set")
@click.option("--project", "project_id", required=True)
@click.option("--model", required=True)
@click.option("--rpm", type=LimitValue(), help="requests per minute")
@click.option("--tpm", type=LimitValue(), help="tokens per minute (prompt + max_tokens)")
@click.option("--rpd", type=LimitValue(), help="requests per day")
@click.option("--batch-tokens-per-day", type=LimitValue(), help="batch input tokens per day")
@click.option("--max-streams", type=LimitValue(), help="concurrent streams")
@click.option("--max-request-tokens", type=LimitValue(),
              help="tokens one realtime generation may reserve (n x max_tokens)")
@with_admin
def limits_set(project_id: str, model: str, api_url: str | None, admin_key: str | None,
               **values: int | None) -> None:
    """Set limits of a project on a model (0: no limit; none: the deployment's
    default)."""
    ctx = click.get_current_context()
    given = {LIMIT_OPTIONS[k]: v for k, v in values.items()
             if ctx.get_parameter_source(k) != click.core.ParameterSource.DEFAULT}
    if not given:
        raise click.UsageError("give at least one of --rpm, --tpm, --rpd, "
                               "--batch-tokens-per-day, --max-streams, --max-request-tokens")
    r = _admin(api_url, admin_key).projects.rate_limits.update_rate_limit(
        f"rl-{model}", project_id=project_id, extra_body=given)
    click.echo(_limit_rows([r]))


@limits.command("list")
@click.option("--project", "project_id", required=True)
@with_admin
def limits_list(project_id: str, api_url: str | None, admin_key: str | None) -> None:
    """A project's limits on every registered model ("-": none)."""
    click.echo(_limit_rows(_admin(api_url, admin_key).projects.rate_limits.list_rate_limits(
        project_id, limit=100)))


# usage ---------------------------------------------------------------------------------------


def _pages(fetch: Callable[..., Any], **params: Any) -> list[Any]:
    buckets: list[Any] = []
    page: str | None = None
    while True:
        resp = fetch(**params, **({"page": page} if page else {}))
        buckets.extend(resp.data)
        page = resp.next_page
        if not resp.has_more or not page:
            return buckets


def usage_table(buckets: list[Any], groups: list[str], values: dict[str, str]) -> str:
    rows = []
    for b in buckets:
        for r in b.results:
            rows.append([when(b.start_time), *(getattr(r, g, None) for g in groups),
                         *(_value(r, attr) for attr in values.values())])
    if not rows:
        return "no usage in this period"
    return table(["START (UTC)", *(g.upper() for g in groups), *values], rows)


def _value(r: Any, attr: str) -> Any:
    v: Any = r
    for part in attr.split("."):
        v = getattr(v, part, None)
    return f"{v:.6f}" if isinstance(v, float) else v


@click.command()
@click.option("--start", default="24h", show_default=True,
              help="epoch seconds, ISO 8601, or an age (30m, 24h, 7d)")
@click.option("--end", default=None, help="as --start (default: now)")
@click.option("--bucket", type=click.Choice(["1m", "1h", "1d"]), default="1d",
              show_default=True)
@click.option("--group-by", "group_by", multiple=True, type=click.Choice(GROUPS),
              help="repeat for several")
@click.option("--project", "project_ids", multiple=True, help="only these projects")
@click.option("--kind", "kinds", multiple=True,
              type=click.Choice(["completions", "embeddings", "costs"]),
              help="default: all three")
@with_admin
def usage(start: str, end: str | None, bucket: str, group_by: tuple[str, ...],
          project_ids: tuple[str, ...], kinds: tuple[str, ...], api_url: str | None,
          admin_key: str | None) -> None:
    """Usage (tokens, requests) and costs per time bucket, from the Admin API."""
    t0 = parse_time(start, "--start")
    window: dict[str, Any] = {"start_time": t0}
    if end is not None:
        window["end_time"] = parse_time(end, "--end")
    if project_ids:
        window["project_ids"] = list(project_ids)
    org = _admin(api_url, admin_key)
    sections = []
    for kind in kinds or ("completions", "embeddings", "costs"):
        if kind == "costs":
            groups = [g for g in group_by if g in COST_GROUPS]
            buckets = _pages(org.usage.costs, **window, bucket_width="1d",
                             **({"group_by": groups} if groups else {}))
            body = usage_table(buckets, groups, {"AMOUNT": "amount.value",
                                                 "CURRENCY": "amount.currency"})
        else:
            allowed = GROUPS if kind == "completions" else EMBEDDING_GROUPS
            groups = [g for g in group_by if g in allowed]
            buckets = _pages(getattr(org.usage, kind), **window, bucket_width=bucket,
                             **({"group_by": groups} if groups else {}))
            values = {"REQUESTS": "num_model_requests", "INPUT TOKENS": "input_tokens"}
            if kind == "completions":
                values["OUTPUT TOKENS"] = "output_tokens"
            body = usage_table(buckets, groups, values)
        sections.append(f"{kind}:\n{body}")
    click.echo("\n\n".join(sections))
