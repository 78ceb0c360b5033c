"""The Admin API driven by the official SDK's admin client in strict response validation,
over HTTP, against two API apps on one database (as two API processes are): projects,
service accounts, keys, rate limits; revocation and archiving seen by the other one
at the next request; admin and project keys kept apart; hostile input refused."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI
from sqlalchemy import select, update
from werkzeug.serving import make_server

from jobs.core.access_tables import ApiKey, RateLimit
from jobs.core.context import Context
from jobs.core.schema import Tenant
from jobs.core.settings import Settings
from jobs.tenants import auth

MODEL = "all-MiniLM-L6-v2"
ORG = "/v1/organization"


@pytest.fixture(scope="module")
def servers(settings: Settings, tenant_key: str) -> Iterator[list[str]]:
    """Two API apps (create_app each, own Context) on threaded HTTP servers."""
    from api.app import create_app

    running = []
    for _ in range(2):
        srv = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        running.append(srv)
    yield [f"http://127.0.0.1:{s.server_port}/v1" for s in running]
    for s in running:
        s.shutdown()


@pytest.fixture(scope="module")
def admin(servers: list[str], admin_key: str) -> Any:
    return OpenAI(base_url=servers[0], admin_api_key=admin_key, api_key="unused",
                  _strict_response_validation=True, max_retries=0).admin.organization


def project_client(base_url: str, key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=key, _strict_response_validation=True,
                  max_retries=0)


def unique(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}"


def test_projects_keys_and_limits_end_to_end(admin: Any, servers: list[str], ctx: Context,
                                             settings: Settings) -> None:
    name = unique("search")
    p = admin.projects.create(name=name)
    assert p.id.startswith("proj_") and p.name == name and p.status == "active"
    assert p.archived_at is None and p.weight == 1
    assert admin.projects.retrieve(p.id).id == p.id
    assert p.id in [x.id for x in admin.projects.list(limit=2)]  # paged, 2 at a time

    sa = admin.projects.service_accounts.create(p.id, name="etl")
    assert sa.id.startswith("svc_acct_") and sa.role == "member" and sa.name == "etl"
    first = sa.api_key
    assert first is not None and first.id.startswith("key_") and first.value.startswith("iq-")
    with ctx.db.session() as s:  # stored hashed: the value is nowhere in the row
        row = s.get(ApiKey, first.id)
        assert row is not None and first.value not in (row.key_hash, row.prefix, row.suffix)
    assert [m.id for m in project_client(servers[1], first.value).models.list()]

    second = admin.projects.service_accounts.api_keys.create(sa.id, project_id=p.id,
                                                             name="second")
    assert second.value != first.value and second.name == "second"
    keys = {k.id: k for k in admin.projects.api_keys.list(p.id)}
    assert set(keys) == {first.id, second.id}
    for k in keys.values():
        assert k.owner.type == "service_account" and k.owner.service_account.id == sa.id
        assert k.owner_project_access == "active"
        assert k.redacted_value.endswith(first.value[-4:] if k.id == first.id
                                         else second.value[-4:])
        assert first.value not in k.redacted_value and second.value not in k.redacted_value
    got = admin.projects.api_keys.retrieve(second.id, project_id=p.id)
    assert got.name == "second" and got.last_used_at is None
    assert admin.projects.service_accounts.retrieve(sa.id, project_id=p.id).name == "etl"
    assert [x.id for x in admin.projects.service_accounts.list(p.id)] == [sa.id]

    # rate limits: one per registered model, "no limit" until set
    limits = {r.model: r for r in admin.projects.rate_limits.list_rate_limits(p.id)}
    assert MODEL in limits and limits[MODEL].id == f"rl-{MODEL}"
    assert limits[MODEL].max_requests_per_1_minute == settings.rate_limit_unlimited
    assert limits[MODEL].max_requests_per_1_day is None
    r = admin.projects.rate_limits.update_rate_limit(
        f"rl-{MODEL}", project_id=p.id, max_requests_per_1_minute=10,
        max_tokens_per_1_minute=5000, max_requests_per_1_day=700,
        batch_1_day_max_input_tokens=10**6, extra_body={"max_concurrent_streams": 3})
    assert (r.max_requests_per_1_minute, r.max_tokens_per_1_minute, r.max_requests_per_1_day,
            r.batch_1_day_max_input_tokens, r.max_concurrent_streams) == (10, 5000, 700,
                                                                          10**6, 3)
    r = admin.projects.rate_limits.update_rate_limit(  # one field: the others stay
        f"rl-{MODEL}", project_id=p.id, max_requests_per_1_day=800)
    assert (r.max_requests_per_1_minute, r.max_requests_per_1_day) == (10, 800)
    r = admin.projects.rate_limits.update_rate_limit(  # null clears one
        f"rl-{MODEL}", project_id=p.id, extra_body={"max_tokens_per_1_minute": None})
    assert r.max_tokens_per_1_minute == settings.rate_limit_unlimited
    listed = {x.model: x for x in admin.projects.rate_limits.list_rate_limits(p.id)}[MODEL]
    assert listed.max_requests_per_1_minute == 10 and listed.max_concurrent_streams == 3
    with ctx.db.session() as s:  # what the limiter reads
        rl = s.get(RateLimit, (p.id, MODEL))
        assert rl is not None
        assert (rl.max_requests_per_1_minute, rl.max_tokens_per_1_minute,
                rl.max_requests_per_1_day, rl.batch_1_day_max_input_tokens,
                rl.max_concurrent_streams) == (10, None, 800, 10**6, 3)

    # update: name and the fair-share weight (an extension)
    renamed = unique("search-renamed")
    p2 = admin.projects.update(p.id, name=renamed, extra_body={"weight": 5})
    assert (p2.name, p2.weight) == (renamed, 5)
    with ctx.db.session() as s:
        assert s.scalar(select(Tenant.weight).where(Tenant.id == p.id)) == 5

    # revoke: the other API app refuses the key at its next request; the first still works
    other = project_client(servers[1], second.value)
    assert other.models.list().data
    deleted = admin.projects.api_keys.delete(second.id, project_id=p.id)
    assert deleted.deleted and deleted.id == second.id
    with pytest.raises(openai.AuthenticationError):
        other.models.list()
    assert project_client(servers[1], first.value).models.list().data
    assert [k.id for k in admin.projects.api_keys.list(p.id)] == [first.id]
    with pytest.raises(openai.NotFoundError):
        admin.projects.api_keys.retrieve(second.id, project_id=p.id)

    # archive: every key of the project is refused, the project is listed only on request
    archived = admin.projects.archive(p.id)
    assert archived.status == "archived" and archived.archived_at is not None
    for base in servers:
        with pytest.raises(openai.AuthenticationError):
            project_client(base, first.value).models.list()
    assert p.id not in [x.id for x in admin.projects.list()]
    assert p.id in [x.id for x in admin.projects.list(include_archived=True)]
    assert [k.owner_project_access for k in admin.projects.api_keys.list(p.id)] == ["inactive"]
    with pytest.raises(openai.ConflictError):
        admin.projects.update(p.id, name=unique("again"))
    with pytest.raises(openai.ConflictError):
        admin.projects.service_accounts.create(p.id, name="late")
    assert admin.projects.archive(p.id).archived_at == archived.archived_at  # idempotent


def test_service_account_only_expiry_and_deletion(admin: Any, servers: list[str],
                                                  ctx: Context) -> None:
    p = admin.projects.create(name=unique("accounts"))
    bare = admin.projects.service_accounts.create(p.id, name="bare",
                                                  create_service_account_only=True)
    assert bare.api_key is None and bare.role == "none"
    assert list(admin.projects.api_keys.list(p.id)) == []

    sa = admin.projects.service_accounts.create(p.id, name="short", expires_in_seconds=3600)
    assert sa.api_key is not None and sa.api_key.expires_at is not None
    assert sa.api_key.expires_at - sa.api_key.created_at == 3600
    client = project_client(servers[0], sa.api_key.value)
    assert client.models.list().data
    with ctx.db.session() as s:  # expired now
        s.execute(update(ApiKey).where(ApiKey.id == sa.api_key.id).values(expires_at=1))
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    access = admin.projects.api_keys.list(p.id, owner_project_access="inactive")
    assert [k.id for k in access] == [sa.api_key.id]
    assert list(admin.projects.api_keys.list(p.id, owner_project_access="active")) == []

    keep = admin.projects.service_accounts.create(p.id, name="keep")
    gone = admin.projects.service_accounts.delete(keep.id, project_id=p.id)
    assert gone.deleted and gone.id == keep.id
    with pytest.raises(openai.AuthenticationError):
        project_client(servers[1], keep.api_key.value).models.list()
    with pytest.raises(openai.NotFoundError):
        admin.projects.service_accounts.retrieve(keep.id, project_id=p.id)


def test_admin_and_project_keys_are_kept_apart(servers: list[str], admin_key: str,
                                               tenant_key: str) -> None:
    as_project = OpenAI(base_url=servers[0], admin_api_key=tenant_key, api_key="unused",
                        max_retries=0).admin.organization
    with pytest.raises(openai.PermissionDeniedError) as e:
        as_project.projects.list()
    assert e.value.status_code == 403 and e.value.code == "insufficient_permissions"
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=servers[0], admin_api_key="iq-admin-wrong", api_key="unused",
               max_retries=0).admin.organization.projects.list()
    with_admin = project_client(servers[0], admin_key)
    with pytest.raises(openai.AuthenticationError):
        with_admin.models.list()
    with pytest.raises(openai.AuthenticationError):
        with_admin.files.list()


def test_another_projects_ids_are_not_found(admin: Any) -> None:
    a = admin.projects.create(name=unique("iso-a"))
    b = admin.projects.create(name=unique("iso-b"))
    b_sa = admin.projects.service_accounts.create(b.id, name="b")
    calls = [
        lambda: admin.projects.api_keys.retrieve(b_sa.api_key.id, project_id=a.id),
        lambda: admin.projects.api_keys.delete(b_sa.api_key.id, project_id=a.id),
        lambda: admin.projects.service_accounts.retrieve(b_sa.id, project_id=a.id),
        lambda: admin.projects.service_accounts.delete(b_sa.id, project_id=a.id),
        lambda: admin.projects.service_accounts.api_keys.create(b_sa.id, project_id=a.id),
        lambda: admin.projects.retrieve("proj_0000000000000000000000"),
        lambda: admin.projects.rate_limits.update_rate_limit(
            "rl-no-such-model", project_id=a.id, max_requests_per_1_minute=1),
        lambda: admin.projects.rate_limits.update_rate_limit(
            MODEL, project_id=a.id, max_requests_per_1_minute=1),  # not an rl- id
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    # b's key still works: nothing above touched it
    assert admin.projects.api_keys.retrieve(b_sa.api_key.id, project_id=b.id).id


def deep(levels: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for _ in range(levels):
        d = {"a": d}
    return d


BAD_BODIES: list[tuple[str, str, Any, str | None]] = [  # (method, path, body, param)
    ("POST", "/projects", {"name": "x", "weight": deep(200)}, None),
    ("POST", "/projects", {"name": "a\x00b"}, None),
    ("POST", "/projects", {"name": ""}, "name"),
    ("POST", "/projects", {"name": "   "}, "name"),
    ("POST", "/projects", {"name": "n" * 201}, "name"),
    ("POST", "/projects", {"name": 7}, "name"),
    ("POST", "/projects", {"name": "x", "weight": 0}, "weight"),
    ("POST", "/projects", {"name": "x", "weight": 10**40}, "weight"),
    ("POST", "/projects", {"name": "x", "weight": True}, "weight"),
    ("POST", "/projects", {"name": "x", "surprise": 1}, "surprise"),
    ("POST", "/projects", {"name": "x", "geography": "EU"}, "geography"),
    ("POST", "/projects", "[" * 10_000, None),
    ("POST", "/projects", '{"name": "x", "weight": 1e400}', None),
    ("POST", "/projects", b'{"name": "\xff\xfe"}', None),
    ("POST", "/projects/{p}", {"weight": -1}, "weight"),
    ("POST", "/projects/{p}/service_accounts", {}, "name"),
    ("POST", "/projects/{p}/service_accounts", {"name": "s", "expires_in_seconds": 2**70},
     "expires_in_seconds"),
    ("POST", "/projects/{p}/service_accounts", {"name": "s",
                                                "create_service_account_only": "yes"},
     "create_service_account_only"),
    ("POST", "/projects/{p}/rate_limits/rl-" + MODEL, {"max_requests_per_1_minute": 2**63},
     "max_requests_per_1_minute"),
    ("POST", "/projects/{p}/rate_limits/rl-" + MODEL, {"max_requests_per_1_minute": 1.5},
     "max_requests_per_1_minute"),
    ("POST", "/projects/{p}/rate_limits/rl-" + MODEL, {"max_requests_per_1_minute": "10"},
     "max_requests_per_1_minute"),
    ("POST", "/projects/{p}/rate_limits/rl-" + MODEL, {"max_tokens_per_1_minute": -1},
     "max_tokens_per_1_minute"),
    ("POST", "/projects/{p}/rate_limits/rl-" + MODEL, {"max_concurrent_streams": 2**31},
     "max_concurrent_streams"),
    ("POST", "/projects/{p}/rate_limits/rl-" + MODEL, {"max_images_per_1_minute": 5},
     "max_images_per_1_minute"),
    ("POST", "/projects/{p}/rate_limits/rl-" + MODEL, {}, None),
    ("GET", "/projects?include_archived=maybe", None, "include_archived"),
    ("GET", "/projects?limit=0", None, "limit"),
    ("GET", "/projects?after=proj_0000000000000000000000", None, "after"),
    ("GET", "/projects/{p}/api_keys?owner_project_access=all", None,
     "owner_project_access"),
    ("GET", "/projects/{p}/rate_limits?after=rl-nope", None, "after"),
]


@pytest.mark.parametrize("method,path,body,param", BAD_BODIES,
                         ids=[f"{m} {p} {i}" for i, (m, p, _, _) in enumerate(BAD_BODIES)])
def test_hostile_input_is_a_client_error(app: Any, admin_key: str, method: str, path: str,
                                         body: Any, param: str | None) -> None:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {admin_key}"
    pid = c.post(f"{ORG}/projects", json={"name": unique("hostile")}).get_json()["id"]
    kw: dict[str, Any] = {}
    if isinstance(body, str | bytes):
        kw = {"data": body, "content_type": "application/json"}
    elif body is not None:
        kw = {"json": body}
    resp = c.open(ORG + path.format(p=pid), method=method, **kw)
    assert resp.status_code == 400, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err


@pytest.mark.parametrize("path", [
    "/projects/proj_%00x", "/projects/" + "p" * 5000, "/projects/x'%20OR%201=1--/api_keys",
    "/projects/{p}/api_keys/key_%ff", "/projects/{p}/service_accounts/%E2%80%AE",
    "/projects/{p}/rate_limits/rl-%00"])
def test_ids_no_object_can_have_are_not_found(app: Any, admin_key: str, path: str) -> None:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {admin_key}"
    pid = c.post(f"{ORG}/projects", json={"name": unique("ids")}).get_json()["id"]
    method = "POST" if "rate_limits/" in path else "GET"
    resp = c.open(ORG + path.format(p=pid), method=method,
                  json={"max_requests_per_1_minute": 1} if method == "POST" else None)
    assert resp.status_code == 404, resp.get_data(as_text=True)
    assert set(resp.get_json()["error"]) == {"message", "type", "param", "code"}


def test_a_project_name_is_unique(admin: Any) -> None:
    name = unique("twice")
    admin.projects.create(name=name)
    with pytest.raises(openai.ConflictError) as e:
        admin.projects.create(name=name)
    assert e.value.code == "project_exists"


def test_rate_limits_report_what_is_enforced(settings: Settings, admin_key: str) -> None:
    """No value of the project's: the deployment's default; 0: no limit; null: back to
    the default (as jobs.tenants.limits decides)."""
    from api.app import create_app

    st = settings.model_copy(update={"default_max_requests_per_1_minute": 50,
                                     "default_max_requests_per_1_day": 777})
    c = create_app(st).test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {admin_key}"
    pid = c.post(f"{ORG}/projects", json={"name": unique("defaults")}).get_json()["id"]
    url = f"{ORG}/projects/{pid}/rate_limits"

    def mine() -> dict[str, Any]:
        return next(x for x in c.get(url).get_json()["data"] if x["model"] == MODEL)

    assert (mine()["max_requests_per_1_minute"], mine()["max_requests_per_1_day"],
            mine()["max_tokens_per_1_minute"]) == (50, 777, st.rate_limit_unlimited)
    set_ = c.post(f"{url}/rl-{MODEL}", json={"max_requests_per_1_minute": 0,
                                             "max_requests_per_1_day": 0}).get_json()
    assert (set_["max_requests_per_1_minute"], set_["max_requests_per_1_day"]) == \
        (st.rate_limit_unlimited, None)
    c.post(f"{url}/rl-{MODEL}", json={"max_requests_per_1_minute": None,
                                      "max_requests_per_1_day": None})
    assert (mine()["max_requests_per_1_minute"], mine()["max_requests_per_1_day"]) == (50, 777)


def test_a_key_without_service_account_is_listed_in_strict_shape(admin: Any, ctx: Context,
                                                                  tenant_key: str) -> None:
    """Keys made outside the Admin API (``inferq up``'s dev key) have no owner to name."""

    who = auth.authenticate(ctx, tenant_key)
    k = admin.projects.api_keys.retrieve(who.api_key_id, project_id=who.tenant_id)
    assert k.owner.type is None and k.owner.service_account is None
    assert k.redacted_value.endswith(tenant_key[-4:]) and k.owner_project_access == "active"
    assert who.api_key_id in [x.id for x in admin.projects.api_keys.list(who.tenant_id)]
