"""Datasets in place: ``inferq submit s3://…`` and the locations a project may use."""

from __future__ import annotations

from typing import Any

import click

from cli.admin import table, when, with_admin
from cli.client import connect_admin
from jobs.core.settings import Settings

DATASET_SCHEMES = ("s3://", "file://")


def is_dataset_uri(path: str) -> bool:
    return path.startswith(DATASET_SCHEMES)


def dataset_body(uri: str, endpoint: str, defaults: dict[str, Any], fmt: str | None,
                 id_column: str | None, input_column: str | None, template: str | None,
                 system: str | None, output: str | None) -> dict[str, Any]:
    """The ``POST /v1/batches`` fields of a batch over the dataset at ``uri``:
    ``defaults`` (every request's parameters, the model included) as its ``body``."""
    if "model" not in defaults:
        raise click.ClickException("a dataset names no model: pass --model "
                                   "(e.g. --model all-MiniLM-L6-v2)")
    source: dict[str, Any] = {"uri": uri}
    for name, value in (("format", fmt), ("id_column", id_column),
                        ("input_column", input_column), ("template", template),
                        ("system", system)):
        if value is not None:
            source[name] = value
    body: dict[str, Any] = {"endpoint": endpoint, "completion_window": "24h",
                            "input_dataset": source, "body": defaults}
    if output is not None:
        body["output_dataset"] = {"uri": output}
    return body


def create_batch(client: Any, body: dict[str, Any], headers: dict[str, str] | None) -> Any:
    from openai.types import Batch

    return client.post("/batches", cast_to=Batch, body=body,
                       options={"headers": headers} if headers else {})


# projects locations -------------------------------------------------------------------------


def _client(api_url: str | None, admin_key: str | None) -> Any:
    return connect_admin(Settings.from_env(), api_url, admin_key)


@click.group("locations")
def locations() -> None:
    """Where a project's batches may read datasets and write outputs in place."""


@locations.command("add")
@click.argument("project_id")
@click.argument("uri")
@click.option("--access", type=click.Choice(["read", "write", "read_write"]), default="read",
              show_default=True, help="read: batch inputs; write: output datasets")
@with_admin
def locations_add(project_id: str, uri: str, access: str, api_url: str | None,
                  admin_key: str | None) -> None:
    """Let PROJECT_ID's batches use everything under URI (s3://bucket/prefix/ or
    file:///path/); prints the location's id."""
    loc = _client(api_url, admin_key).post(
        f"/organization/projects/{project_id}/data_locations", cast_to=object,
        body={"uri": uri, "access": access})
    click.echo(loc["id"])


@locations.command("list")
@click.argument("project_id")
@with_admin
def locations_list(project_id: str, api_url: str | None, admin_key: str | None) -> None:
    """List the locations of PROJECT_ID."""
    rows = _client(api_url, admin_key).get(
        f"/organization/projects/{project_id}/data_locations", cast_to=object)["data"]
    click.echo(table(("ID", "URI", "ACCESS", "CREATED"),
                     ((r["id"], r["uri"], r["access"], when(r["created_at"])) for r in rows)))


@locations.command("remove")
@click.argument("project_id")
@click.argument("location_id")
@with_admin
def locations_remove(project_id: str, location_id: str, api_url: str | None,
                     admin_key: str | None) -> None:
    """Take LOCATION_ID away from PROJECT_ID (batches already created keep reading)."""
    _client(api_url, admin_key).delete(
        f"/organization/projects/{project_id}/data_locations/{location_id}", cast_to=object)
    click.echo(f"{location_id} removed")
