"""Following a batch's event stream (``inferq status --watch``, ``submit --wait``): its
Server-Sent Events shown as a progress bar and status lines, resumed from the last event
seen when the connection drops."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import click

from cli.client import batch_progress
from jobs.core.status import TERMINAL

# Following a batch's event stream: a read that waits longer than this for a byte (the
# API sends a keep-alive every INFERQ_EVENTS_KEEPALIVE_S, 15 s by default) is a dropped
# connection; a dropped one is resumed up to RECONNECTS times in a row.
STREAM_READ_TIMEOUT_S = 60.0
RECONNECTS = 8


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
    last_id: str | None = None
    drops = 0
    bar = batch_progress(rate=True, to_stderr=to_stderr)
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
