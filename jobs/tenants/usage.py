"""Usage and cost: what is recorded for billing, and the Admin API's usage and costs
queries over it.

One ``UsageRecord`` per realtime request (``rt:<request id>``), per job
(``job:<id>``) and per committed batch chunk (``chunk:<shard id>:<chunk index>``).
``source`` is unique and every insert is ``ON CONFLICT DO NOTHING``, so a
redelivered chunk or job is never counted twice; a chunk's record is inserted in
the fenced transaction of its checkpoint (``repository.checkpoint``) and a job's in
the one that stores its result (``asyncjobs.complete``), so a writer that lost its
lease counts nothing.

What counts: requests that succeeded (a 200 answer, an ``ok`` output line), as
OpenAI bills; refused and failed requests count neither requests nor tokens nor
time. ``accelerator_seconds`` is a request's share of the engine steps that ran it
(``split``: a step's time divided among its rows by their tokens in that step);
``cost`` is those seconds times the model's price per accelerator-hour, times
``usage_flex_multiplier`` on the flex tier, fixed when the work is recorded.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, overload

from sqlalchemy import ColumnElement, func, literal, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from jobs.core.context import Context
from jobs.core.errors import InvalidRequest
from jobs.core.lanes import FLEX_TIER, tier_of
from jobs.core.schema import UsageRecord
from jobs.core.settings import Settings
from jobs.protocol.endpoints import EMBEDDINGS
from jobs.protocol.objects.admin import (
    Amount,
    Bucket,
    CompletionsUsage,
    CostsResult,
    EmbeddingsUsage,
    UsagePage,
)

COMPLETIONS: Final = "completions"
EMBEDDINGS_KIND: Final = "embeddings"


def kind_of(endpoint: str) -> str:
    """The usage kind of an endpoint: embeddings, or completions (chat and text)."""
    return EMBEDDINGS_KIND if endpoint == EMBEDDINGS else COMPLETIONS


# Accounting ---------------------------------------------------------------------------------

def split(seconds: float, weights: Sequence[int]) -> list[float]:
    """``seconds`` of one engine step divided among its rows in proportion to
    ``weights`` (each row's tokens in the step); the shares sum to ``seconds``. Rows
    that all weigh nothing share equally."""
    total = sum(weights)
    if total <= 0:
        return [seconds / len(weights)] * len(weights) if weights else []
    per = seconds / total
    return [w * per for w in weights]


def price_per_hour(settings: Settings, model: str, service_tier: str) -> float:
    """USD per accelerator-hour of ``model`` on ``service_tier``."""
    base = settings.usage_model_prices.get(model, settings.usage_price_per_accelerator_hour)
    return base * (settings.usage_flex_multiplier if service_tier == FLEX_TIER else 1.0)


def cost(settings: Settings, model: str, service_tier: str, seconds: float) -> float:
    return seconds / 3600.0 * price_per_hour(settings, model, service_tier)


@dataclass(frozen=True)
class Entry:
    """One usage record to insert (see ``UsageRecord``)."""

    source: str
    tenant_id: str
    api_key_id: str | None
    kind: str
    model: str
    lane: str
    service_tier: str
    batch_id: str | None
    num_requests: int
    input_tokens: int
    output_tokens: int
    accelerator_seconds: float
    cost: float


def entry(settings: Settings, *, source: str, tenant_id: str, api_key_id: str | None,
          kind: str, model: str, lane: str, service_tier: str = "default",
          batch_id: str | None = None, num_requests: int = 1, input_tokens: int = 0,
          output_tokens: int = 0, accelerator_seconds: float = 0.0) -> Entry:
    """An entry priced now: cost = seconds x the model's and tier's price."""
    tier = tier_of(service_tier)
    return Entry(source, tenant_id, api_key_id, kind, model, lane, tier, batch_id,
                 num_requests, input_tokens, output_tokens, accelerator_seconds,
                 cost(settings, model, tier, accelerator_seconds))


def record(s: Session, e: Entry, at: float | None = None) -> bool:
    """Insert ``e`` in the caller's transaction; False if its source was counted already."""
    res = s.execute(insert(UsageRecord).values(**asdict(e), created_at=at or time.time())
                    .on_conflict_do_nothing(index_elements=["source"]))
    return bool(res.rowcount)  # type: ignore[attr-defined]


# Queries (the Admin API) --------------------------------------------------------------------

WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
# bucket_width -> (default, max) buckets per page, as OpenAI's usage API.
BUCKET_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
COST_LIMITS = (7, 180)
GROUPS = {
    COMPLETIONS: ("project_id", "api_key_id", "model", "batch", "service_tier", "api_source"),
    EMBEDDINGS_KIND: ("project_id", "api_key_id", "model"),
    "costs": ("project_id", "api_key_id", "line_item", "api_source"),
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")
_LINE_ITEM = re.compile(r"[^\x00-\x1f\x7f]{1,400}")
_CURSOR = re.compile(r"page_([0-9]{1,14})")
MAX_TIME = 2**40  # seconds since 1970: far past any usage, and no integer overflow


@dataclass(frozen=True)
class Query:
    what: str  # completions | embeddings | costs
    start_time: int
    end_time: int
    width: int
    limit: int
    page_start: int  # aligned edge of this page's first bucket
    group_by: tuple[str, ...] = ()
    project_ids: tuple[str, ...] = ()
    api_key_ids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    line_items: tuple[str, ...] = ()
    batch: bool | None = None


def _one(args: Mapping[str, list[str]], name: str) -> str | None:
    values = args.get(name) or []
    if len(values) > 1:
        raise InvalidRequest(f"{name} is given {len(values)} times; give it once", param=name)
    return values[0] if values else None


def _int(args: Mapping[str, list[str]], name: str, lo: int, hi: int) -> int | None:
    raw = _one(args, name)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 15 or not lo <= int(raw) <= hi:
        raise InvalidRequest(f"{name} must be an integer from {lo} to {hi}", param=name)
    return int(raw)


def _names(args: Mapping[str, list[str]], name: str, pattern: re.Pattern[str]
           ) -> tuple[str, ...]:
    out: list[str] = []
    for raw in args.get(name) or []:
        for v in (raw.split(",") if pattern is _NAME else [raw]):
            if not pattern.fullmatch(v):
                raise InvalidRequest(f"{name}: {v[:60]!r} is not a valid value", param=name)
            out.append(v)
    if len(out) > 1000:
        raise InvalidRequest(f"{name}: at most 1000 values", param=name)
    return tuple(dict.fromkeys(out))


def parse_query(what: str, args: Mapping[str, list[str]], now: float | None = None) -> Query:
    """The query of ``GET /v1/organization/usage/<what>`` or ``/costs`` (``what``:
    completions, embeddings or costs) from its parameters (name -> values; ``name[]``
    already folded into ``name``). Bad values raise InvalidRequest (400)."""
    start = _int(args, "start_time", 0, MAX_TIME)
    if start is None:
        raise InvalidRequest("start_time is required (Unix seconds, inclusive)",
                             param="start_time", code="missing_required_parameter")
    end = _int(args, "end_time", 0, MAX_TIME)
    width_name = _one(args, "bucket_width") or "1d"
    if what == "costs" and width_name != "1d":
        raise InvalidRequest("bucket_width: costs support only 1d", param="bucket_width")
    if width_name not in WIDTHS:
        raise InvalidRequest("bucket_width must be one of 1m, 1h, 1d", param="bucket_width")
    width = WIDTHS[width_name]
    default, most = COST_LIMITS if what == "costs" else BUCKET_LIMITS[width_name]
    limit = _int(args, "limit", 1, most) or default
    if end is None:  # up to now: the bucket in progress included
        end = (int(now if now is not None else time.time()) // width + 1) * width
    if end <= start:
        raise InvalidRequest("end_time must be after start_time", param="end_time")
    first = start // width * width
    page_start = first
    if (cursor := _one(args, "page")) is not None:
        m = _CURSOR.fullmatch(cursor)
        if m is None or int(m[1]) % width or not first <= int(m[1]) < end:
            raise InvalidRequest("page: not a cursor of this query; pass next_page from the "
                                 "previous page", param="page")
        page_start = int(m[1])
    allowed = GROUPS[what]
    group_by: list[str] = []
    for g in _names(args, "group_by", _NAME):
        if g not in allowed:
            raise InvalidRequest(f"group_by: {g!r} is not supported here; use any of "
                                 f"{', '.join(allowed)}", param="group_by")
        group_by.append(g)
    if args.get("user_ids"):
        raise InvalidRequest("user_ids: this service has no users; filter by project_ids "
                             "or api_key_ids", param="user_ids")
    batch = _one(args, "batch") if what == COMPLETIONS else None
    if batch is not None and batch not in ("true", "false"):
        raise InvalidRequest("batch must be true or false", param="batch")
    return Query(what, start, end, width, limit, page_start, tuple(group_by),
                 _names(args, "project_ids", _NAME), _names(args, "api_key_ids", _NAME),
                 _names(args, "models", _NAME) if what != "costs" else (),
                 _names(args, "line_items", _LINE_ITEM) if what == "costs" else (),
                 None if batch is None else batch == "true")


Result = CompletionsUsage | EmbeddingsUsage | CostsResult
# what -> the models of its page and buckets
PAGES: dict[str, tuple[type[UsagePage[Any]], type[Bucket[Any]]]] = {
    COMPLETIONS: (UsagePage[CompletionsUsage], Bucket[CompletionsUsage]),
    EMBEDDINGS_KIND: (UsagePage[EmbeddingsUsage], Bucket[EmbeddingsUsage]),
    "costs": (UsagePage[CostsResult], Bucket[CostsResult]),
}

_COLUMNS: dict[str, Any] = {
    "project_id": UsageRecord.tenant_id, "api_key_id": UsageRecord.api_key_id,
    "model": UsageRecord.model, "service_tier": UsageRecord.service_tier,
    "batch": UsageRecord.batch_id.is_not(None),
}


def _line_item(model: str, tier: str) -> str:
    """A cost line: one per model and service tier (each has its own price)."""
    return f"{model}, {tier}"


def page(s: Session, q: Query) -> UsagePage[Any]:
    """One page of buckets: ``limit`` buckets from ``q.page_start``, empty ones
    included. Bucket edges are multiples of the width (UTC); the first and last are
    clipped to [start_time, end_time), and each counts exactly the records created in
    the interval it reports."""
    stop = min(q.page_start + q.limit * q.width, q.end_time)
    lo, hi = max(q.page_start, q.start_time), stop
    bucket = (func.floor(UsageRecord.created_at / q.width) * q.width).label("bucket")
    keys: list[tuple[str, Any]] = []
    for g in q.group_by:
        if g == "line_item":
            keys += [("model", UsageRecord.model), ("service_tier", UsageRecord.service_tier)]
        elif g in _COLUMNS:
            keys.append((g, _COLUMNS[g]))
    cols = [c.label(f"k_{n}") for n, c in keys]
    sums = [func.count().label("records"),
            func.coalesce(func.sum(UsageRecord.num_requests), 0).label("num_requests"),
            func.coalesce(func.sum(UsageRecord.input_tokens), 0).label("input_tokens"),
            func.coalesce(func.sum(UsageRecord.output_tokens), 0).label("output_tokens"),
            func.coalesce(func.sum(UsageRecord.accelerator_seconds), 0.0).label("seconds"),
            func.coalesce(func.sum(UsageRecord.cost), 0.0).label("cost")]
    where: list[ColumnElement[bool]] = [UsageRecord.created_at >= lo, UsageRecord.created_at < hi]
    if q.what != "costs":
        where.append(UsageRecord.kind == q.what)
    if q.project_ids:
        where.append(UsageRecord.tenant_id.in_(q.project_ids))
    if q.api_key_ids:
        where.append(UsageRecord.api_key_id.in_(q.api_key_ids))
    if q.models:
        where.append(UsageRecord.model.in_(q.models))
    if q.batch is not None:
        where.append(UsageRecord.batch_id.is_not(None) if q.batch
                     else UsageRecord.batch_id.is_(None))
    if q.line_items:
        where.append((UsageRecord.model + literal(", ") + UsageRecord.service_tier)
                     .in_(q.line_items))
    stmt = (select(bucket, *cols, *sums).where(*where).group_by(bucket, *cols)
            .order_by(bucket, *cols))
    found: dict[int, list[Any]] = {}
    for row in s.execute(stmt):
        found.setdefault(int(row.bucket), []).append(row)
    page_of, bucket_of = PAGES[q.what]
    data = [bucket_of(start_time=max(edge, q.start_time),
                      end_time=min(edge + q.width, q.end_time),
                      results=[_result(q, row) for row in found.get(edge, [])])
            for edge in range(q.page_start, stop, q.width)]
    more = stop < q.end_time
    return page_of(data=data, has_more=more, next_page=f"page_{stop}" if more else None)


@overload
def query(ctx: Context, what: Literal["completions"], args: Mapping[str, list[str]]
          ) -> UsagePage[CompletionsUsage]: ...
@overload
def query(ctx: Context, what: Literal["embeddings"], args: Mapping[str, list[str]]
          ) -> UsagePage[EmbeddingsUsage]: ...
@overload
def query(ctx: Context, what: Literal["costs"], args: Mapping[str, list[str]]
          ) -> UsagePage[CostsResult]: ...
def query(ctx: Context, what: str, args: Mapping[str, list[str]]) -> UsagePage[Any]:
    """The use case behind ``GET /v1/organization/usage/<what>`` and ``/costs``."""
    q = parse_query(what, args)
    with ctx.db.session() as s:
        return page(s, q)


def _result(q: Query, row: Any) -> Result:
    m = row._mapping
    grouped = set(q.group_by)

    def key(name: str) -> Any:
        return m[f"k_{name}"] if name in grouped else None

    source = "unlabeled" if "api_source" in grouped else None
    if q.what == "costs":
        item = (_line_item(m["k_model"], m["k_service_tier"]) if "line_item" in grouped
                else None)
        return CostsResult(
            amount=Amount(value=_money(m["cost"])), line_item=item,
            project_id=key("project_id"), api_key_id=key("api_key_id"), user_id=None,
            api_source=source, quantity=float(m["seconds"]) if item is not None else None,
            quantity_unit="duration_seconds" if item is not None else None)
    input_tokens, requests = int(m["input_tokens"]), int(m["num_requests"])
    if q.what == EMBEDDINGS_KIND:
        return EmbeddingsUsage(
            input_tokens=input_tokens, num_model_requests=requests,
            project_id=key("project_id"), user_id=None, api_key_id=key("api_key_id"),
            model=key("model"))
    batch = m["k_batch"] if "batch" in grouped else None
    return CompletionsUsage(
        input_tokens=input_tokens, num_model_requests=requests,
        project_id=key("project_id"), user_id=None, api_key_id=key("api_key_id"),
        model=key("model"), output_tokens=int(m["output_tokens"]), input_cached_tokens=0,
        input_audio_tokens=0, output_audio_tokens=0,
        batch=None if batch is None else bool(batch), service_tier=key("service_tier"),
        api_source=source)


def _money(value: float) -> float:
    v = float(value)
    return 0.0 if not math.isfinite(v) else round(v, 10)
