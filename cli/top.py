"""``inferq top``: the service at a glance, refreshed every second from
``GET /v1/dashboard/overview``: queue depths by lane, the latency of each lane (time to
first token and queue time, p50 and p99 over the last 5 and 60 minutes, with rates),
the live workers and the running batches with their progress.

A project key (the default: ``--api-key`` or the dev key of the data dir) shows its
project's batches; ``--org`` uses the admin key and shows every project's. ``--once``
prints one frame and exits. A failure is one line and exit status 1; Ctrl-C exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import datetime
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from cli import client
from jobs.core.settings import Settings

RUNNING = ("validating", "in_progress", "finalizing", "cancelling")
BREAKER_STYLE = {"closed": "green", "half_open": "yellow", "open": "bold red"}
WINDOW_S = 3600
PIPE_WIDTH = 160  # --once into a pipe: the whole frame, not 80 columns of it


def seconds(v: float | None) -> str:
    """A latency: milliseconds below a second."""
    if v is None:
        return "–"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def duration(v: float | None) -> str:
    """A time left: 42 s, 3m20s, 1h05m."""
    if v is None:
        return "–"
    s = int(round(v))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def rate(v: float | None) -> str:
    """Per second, to three digits at most."""
    if v is None:
        return "–"
    return f"{v:.0f}/s" if v >= 100 else f"{v:.1f}/s" if v >= 10 else f"{v:.2f}/s"


def _lanes(o: dict[str, Any]) -> Table:
    t = Table(title="Lanes", title_justify="left", expand=False)
    t.add_column("LANE")
    t.add_column("MODEL")
    t.add_column("QUEUED", justify="right")
    for x in o["lanes"]:
        t.add_row(x["lane"], x["model"] or "", str(x["queue_depth"]))
    return t


def _latency(o: dict[str, Any]) -> Table:
    t = Table(title="Latency (p50 / p99)", title_justify="left")
    t.add_column("LANE")
    t.add_column("METRIC")
    for w in ("5m", "60m"):
        t.add_column(f"{w} RATE", justify="right")
        t.add_column(f"{w} P50", justify="right")
        t.add_column(f"{w} P99", justify="right")
    for s in o["latency"]["series"]:
        cells = []
        for summary in s.get("summary", []):
            cells += [rate(summary["rate_per_s"]), seconds(summary["p50"]),
                      seconds(summary["p99"])]
        t.add_row(s["lane"], s["metric"], *cells)
    if not o["latency"]["series"]:
        t.add_row("–", "no observations in the last hour")
    return t


def _workers(o: dict[str, Any]) -> Table:
    t = Table(title="Workers", title_justify="left")
    for name in ("NAME", "LANES", "MODELS", "BREAKER"):
        t.add_column(name)
    t.add_column("SEEN", justify="right")
    for w in o["workers"]:
        t.add_row(w["name"], ",".join(w["lanes"]), ",".join(w["models"]),
                  Text(w["breaker"], style=BREAKER_STYLE.get(w["breaker"], "")),
                  f"{w['seen_s_ago']:.1f} s ago")
    if not o["workers"]:
        t.add_row("no live worker")
    return t


def _batches(o: dict[str, Any]) -> Table:
    t = Table(title="Running batches", title_justify="left")
    running = [b for b in o["batches"] if b["status"] in RUNNING]
    width = max([len(b["id"]) for b in running] + [5])
    org = o["scope"] == "organization"
    t.add_column("BATCH / PROJECT" if org else "BATCH", no_wrap=True, min_width=width)
    t.add_column("STATUS", no_wrap=True, min_width=11)
    t.add_column("PROGRESS", min_width=8, max_width=30)  # what the terminal leaves
    for name in ("DONE", "RATE", "ETA"):
        t.add_column(name, justify="right", no_wrap=True)
    for b in running:
        rc = b["request_counts"]
        done, total = rc["completed"] + rc["failed"], rc["total"]
        bar = ProgressBar(total=max(total, 1), completed=done)
        label = Text(b["id"])
        if org:
            label.append("\n" + b["project_id"], style="dim")
        cells: list[RenderableType] = [label, b["status"], bar, f"{done}/{total}",
                                       rate(b["rate_per_s"]), duration(b["eta_s"])]
        t.add_row(*cells)
    if not running:
        t.add_row("no running batch")
    return t


def frame(o: dict[str, Any], url: str, note: str | None = None) -> RenderableType:
    """One screen of ``inferq top`` from an overview (docs/API.md, Dashboard)."""
    who = (f"project {o['project_id']}" if o["scope"] == "project"
           else "every project (admin key)")
    at = datetime.fromtimestamp(o["generated_at"]).strftime("%H:%M:%S")
    head = Text.assemble(("inferq top", "bold"), f"  {url}  {who}  {at}")
    if note:
        head.append(f"  {note}", style="bold red")
    return Group(head, _lanes(o), _latency(o), _workers(o), _batches(o))


class Source:
    """The overview, read through the SDK's HTTP client (its errors are the CLI's)."""

    def __init__(self, url: str, key: str) -> None:
        from openai import OpenAI

        self.url = url
        self.sdk = OpenAI(base_url=url, api_key=key, max_retries=0, timeout=10)

    def read(self) -> dict[str, Any]:
        got = self.sdk.get("/dashboard/overview", cast_to=object,
                              options={"params": {"window": WINDOW_S}})
        if not isinstance(got, dict) or got.get("object") != "dashboard.overview":
            raise click.ClickException(f"{self.url} answered something other than a "
                                       "dashboard overview: is it an inferq API?")
        return got


def _live(src: Source, first: dict[str, Any], interval: float) -> None:
    """Redraw every ``interval`` until Ctrl-C; an API that stops answering is shown on
    the last frame and tried again. Ctrl-C also leaves a mark the loop reads: Python
    drops a KeyboardInterrupt raised inside a finalizer (a response the garbage
    collector closes), and the view must end even when its interrupt was lost so."""
    import openai

    interrupted = threading.Event()

    def on_ctrl_c(signum: int, frame_: Any) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    last = first
    try:
        with Live(frame(first, src.url), auto_refresh=False, screen=True,
                  redirect_stderr=False) as live:
            while not interrupted.wait(interval):
                try:
                    last, note = src.read(), None
                except openai.APIConnectionError:
                    note = "the API does not answer; retrying"
                live.update(frame(last, src.url, note), refresh=True)
    finally:
        signal.signal(signal.SIGINT, previous)


@click.command()
@client.api_url_option
@click.option("--api-key", envvar="INFERQ_API_KEY", default=None,
              help="a project key: its project's batches (default: the dev key of the "
                   "data dir)")
@click.option("--org", is_flag=True, help="every project's batches, with the admin key")
@click.option("--admin-key", envvar="INFERQ_ADMIN_KEY", default=None,
              help="the admin key for --org (default: the one of the data dir)")
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one frame and exit")
def top(api_url: str | None, api_key: str | None, org: bool, admin_key: str | None,
        interval: float, once: bool) -> None:
    """A live view of queues, latencies, workers and running batches (Ctrl-C quits)."""
    import openai

    from cli.errors import ADMIN_KEY_HINT

    st = Settings.from_env()
    url = client.api_url(st, api_url)
    if org:
        key = client._key(st, admin_key, "admin-api-key", "admin key",
                          "--admin-key (INFERQ_ADMIN_KEY)")
    else:
        key = client._key(st, api_key, "dev-api-key", "API key", "--api-key (INFERQ_API_KEY)")
    src = Source(url, key)
    try:
        first = src.read()
        if once:
            # Into a pipe or a file: as wide as the frame needs (rich would cut it to
            # 80 columns), unless COLUMNS says otherwise.
            piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
            Console(width=PIPE_WIDTH if piped else None).print(frame(first, url))
            return
        _live(src, first, interval)
    except openai.AuthenticationError as e:
        if not org:
            raise
        raise click.ClickException(f"the API refused the admin key: {ADMIN_KEY_HINT}") from e
    except KeyboardInterrupt:
        return
