"""``inferq retry``: a batch's failed requests run again, as a child batch."""

from __future__ import annotations

from typing import Any

import click

from cli.batches import wait_for, with_client
from cli.client import connect
from jobs.core.settings import Settings


@click.command()
@click.argument("batch_id")
@click.option("--error-code", "error_codes", multiple=True, metavar="CODE",
              help="rerun only the requests that failed with this code (repeatable; "
                   "default: every failed request but those a rerun cannot fix, such as "
                   "context_length_exceeded)")
@click.option("--wait/--no-wait", default=False,
              help="follow the rerun's progress until it ends")
@with_client
def retry(batch_id: str, error_codes: tuple[str, ...], wait: bool, api_url: str | None,
          api_key: str | None) -> None:
    """Rerun the failed requests of an ended batch as a new batch; prints its id.

    Afterwards `inferq results BATCH_ID --merged -o FILE` writes each request of
    BATCH_ID once, with its latest result; a batch's output dataset (submit --output)
    gets the rerun's rows when it ends."""
    from openai.types import Batch

    client = connect(Settings.from_env(), api_url, api_key)
    body: dict[str, Any] = {"error_codes": list(error_codes)} if error_codes else {}
    child = client.post(f"/batches/{batch_id}/retry", body=body, cast_to=Batch)
    click.echo(child.id)
    if wait:
        wait_for(client, child.id)
