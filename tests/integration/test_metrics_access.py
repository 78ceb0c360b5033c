"""Who may read the API's /metrics, and what its labels can hold: the Flask app on real
PostgreSQL, Redis and S3 (a database and Redis DB of its own, so no other test's keys
or queues show up in its series).

Only the metrics token or an admin key reads them; made-up methods and paths add no
series; no project or key id appears anywhere in the exposition."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.fleet import builtin_models
from jobs.tenants import auth

TOKEN = "iq-metrics-" + secrets.token_urlsafe(16)


@pytest.fixture
def env(own_settings: Settings) -> Iterator[dict[str, Any]]:
    from api.app import create_app

    st = own_settings.model_copy(update={"metrics_token": TOKEN})
    ctx = Context(st)
    builtin_models.register_builtin_models(ctx)
    project, key = auth.create_tenant(ctx, f"metrics-{secrets.token_hex(3)}")
    admin = f"iq-admin-{secrets.token_urlsafe(16)}"
    auth.ensure_admin_key(ctx, admin)
    principal = auth.authenticate(ctx, key)
    yield {"app": create_app(st), "settings": st, "key": key, "admin": admin,
           "project_id": principal.tenant_id, "key_id": principal.api_key_id}
    ctx.close()


def get_metrics(app: Any, authorization: str | None) -> Any:
    headers = {"Authorization": authorization} if authorization is not None else {}
    return app.test_client().get("/metrics", headers=headers)


def series(app: Any) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    got = get_metrics(app, f"Bearer {TOKEN}")
    assert got.status_code == 200, got.get_data(as_text=True)
    return {(s.name, tuple(sorted(s.labels.items())))
            for fam in text_string_to_metric_families(got.get_data(as_text=True))
            for s in fam.samples}


@pytest.mark.parametrize("authorization,status,code", [
    (None, 401, "invalid_api_key"),
    ("Bearer ", 401, "invalid_api_key"),
    ("Basic " + TOKEN, 401, "invalid_api_key"),
    ("Bearer " + TOKEN[:-1], 401, "invalid_api_key"),
    ("Bearer " + TOKEN + "x", 401, "invalid_api_key"),
    ("Bearer iq-not-a-key", 401, "invalid_api_key"),
    ("project key", 403, "insufficient_permissions"),
], ids=["none", "empty", "basic", "short", "long", "unknown", "project-key"])
def test_metrics_refuse_anyone_without_the_token_or_an_admin_key(
        env: dict[str, Any], authorization: str | None, status: int, code: str) -> None:
    if authorization == "project key":
        authorization = f"Bearer {env['key']}"
    got = get_metrics(env["app"], authorization)
    assert got.status_code == status, got.get_data(as_text=True)
    body = got.get_json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert "inferq_" not in got.get_data(as_text=True)
    if status == 401:
        assert got.headers["www-authenticate"].startswith("Bearer")


def test_the_token_and_an_admin_key_read_the_metrics(env: dict[str, Any]) -> None:
    for authorization in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"Bearer {env['admin']}"):
        got = get_metrics(env["app"], authorization)
        assert got.status_code == 200, (authorization, got.get_data(as_text=True))
        assert got.mimetype == "text/plain"
        assert "# TYPE inferq_api_requests_total counter" in got.get_data(as_text=True)


def test_without_a_token_only_an_admin_key_reads_them(env: dict[str, Any]) -> None:
    from api.app import create_app

    app = create_app(env["settings"].model_copy(update={"metrics_token": ""}))
    assert get_metrics(app, None).status_code == 401
    assert get_metrics(app, "Bearer ").status_code == 401
    assert get_metrics(app, f"Bearer {TOKEN}").status_code == 401
    assert get_metrics(app, f"Bearer {env['key']}").status_code == 403
    assert get_metrics(app, f"Bearer {env['admin']}").status_code == 200


def test_made_up_methods_and_paths_add_no_series(env: dict[str, Any]) -> None:
    app = env["app"]
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {env['key']}"

    def made_up(tag: str) -> None:
        for method in ("BREW", "PROPFIND", f"X{tag.upper()}"):
            c.open("/v1/models", method=method)
            c.open(f"/v1/files/{tag}", method=method)
        for path in (f"/{tag}", f"/v1/{tag}", f"/v1/{tag}/deeper", f"/dashboard/{tag}x"):
            assert c.get(path).status_code == 404
            assert c.post(path, json={}).status_code in (404, 405)

    made_up("warm")  # the series of "other" methods and unmatched routes now exist
    series(app)  # and those of the scrape itself
    before = series(app)
    for _ in range(3):
        made_up(secrets.token_hex(4))
    after = series(app)
    assert after == before, sorted(after - before)
    methods = {dict(lab).get("method") for _, lab in after} - {None}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
    assert "other" in methods
    assert "<unmatched>" in {dict(lab)["route"] for name, lab in after
                             if name == "inferq_api_requests_total"}


def test_no_project_or_key_id_appears_in_the_exposition(env: dict[str, Any]) -> None:
    app = env["app"]
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {env['key']}"
    assert c.get("/v1/models").status_code == 200
    assert c.get("/v1/files").status_code == 200
    assert c.post("/v1/embeddings", json={"model": "no-such-model", "input": "x"}
                  ).status_code == 400
    assert c.get("/v1/batches/batch_nope").status_code == 404
    text = get_metrics(app, f"Bearer {TOKEN}").get_data(as_text=True)
    assert 'route="/v1/models"' in text  # the project's requests are counted
    for secret in (env["project_id"], env["key_id"], env["key"], TOKEN):
        assert secret not in text
    assert "project" not in {k for fam in text_string_to_metric_families(text)
                             for s in fam.samples for k in s.labels}
