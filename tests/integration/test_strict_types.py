"""JSON types are not coerced, as OpenAI does not coerce them: on every route that takes
a body, a string is no number or boolean, a boolean no number, a number with a
decimal point no integer; each is a 400 naming the param. The values clients send
normally (an integer for a number included) still pass. The Flask app on real
PostgreSQL, Redis and S3; every request here is judged before a worker would be
needed (``/v1/jobs`` is stored and answered without one)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from sqlalchemy import select

from jobs.core.context import Context
from jobs.core.schema import Job
from jobs.core.settings import Settings
from jobs.fleet import builtin_models, registry
from jobs.tenants import auth

EMB_MODEL, CHAT_MODEL = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
MSGS = [{"role": "user", "content": "hi"}]
CHAT = {"model": CHAT_MODEL, "messages": MSGS}
PROMPT = {"model": CHAT_MODEL, "prompt": "hi"}
EMB = {"model": EMB_MODEL, "input": "hi"}
RESP = {"model": CHAT_MODEL, "input": "hi"}


def job(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"endpoint": endpoint, "body": body}


# (route, body, param): one wrong JSON type each.
PROJECT_CASES: list[tuple[str, Any, str]] = [
    # the examples: each was coerced before
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, "temperature"),
    ("/v1/embeddings", {**EMB, "dimensions": "8"}, "dimensions"),
    ("/v1/embeddings", {**EMB, "input": [[True, False]]}, "input.0.0"),
    ("/v1/webhook_callback_secret", {"keep_old_secret_active_for_24_hours": "yes"},
     "keep_old_secret_active_for_24_hours"),
    # the same classes elsewhere: bool for int, string for number, string for bool,
    # float for int, bool and int for a bool, bool for number
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 8.0}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "n": True}, "n"),
    ("/v1/chat/completions", {**CHAT, "seed": "7"}, "seed"),
    ("/v1/chat/completions", {**CHAT, "top_p": True}, "top_p"),
    ("/v1/chat/completions", {**CHAT, "stream": 1}, "stream"),
    ("/v1/chat/completions", {**CHAT, "stream": True,
                              "stream_options": {"include_usage": "true"}},
     "stream_options.include_usage"),
    ("/v1/completions", {**PROMPT, "stream": "false"}, "stream"),
    ("/v1/completions", {**PROMPT, "max_tokens": "16"}, "max_tokens"),
    ("/v1/completions", {**PROMPT, "temperature": False}, "temperature"),
    ("/v1/completions", {**PROMPT, "n": 1.0}, "n"),
    ("/v1/embeddings", {**EMB, "dimensions": True}, "dimensions"),
    ("/v1/embeddings", {**EMB, "dimensions": 8.0}, "dimensions"),
    ("/v1/embeddings", {**EMB, "input": [True, 2]}, "input.0"),
    ("/v1/embeddings", {**EMB, "input": [1.0, 2]}, "input.0"),
    ("/v1/responses", {**RESP, "max_output_tokens": True}, "max_output_tokens"),
    ("/v1/responses", {**RESP, "temperature": "0.5"}, "temperature"),
    ("/v1/responses", {**RESP, "stream": "yes"}, "stream"),
    ("/v1/responses", {**RESP, "input": 5}, "input"),
    ("/v1/responses", {**RESP, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": 1}]}]}, "input.0.content.0.text"),
    ("/v1/jobs", job("/v1/responses", {**RESP, "max_output_tokens": 8.0}),
     "max_output_tokens"),
    ("/v1/jobs", job("/v1/chat/completions", {**CHAT, "max_tokens": True}), "max_tokens"),
    ("/v1/jobs", job("/v1/completions", {**PROMPT, "temperature": "0.5"}), "temperature"),
    ("/v1/jobs", job("/v1/embeddings", {**EMB, "dimensions": "8"}), "dimensions"),
    ("/v1/jobs", {**job("/v1/embeddings", EMB), "callback_url": True}, "callback_url"),
    ("/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/embeddings",
                     "completion_window": "24h", "metadata": {"k": 1}}, "metadata.k"),
    ("/v1/webhook_callback_secret", {"keep_old_secret_active_for_24_hours": 1},
     "keep_old_secret_active_for_24_hours"),
    ("/v1/webhook_endpoints", {"name": "x", "url": "https://example.com/hook",
                               "event_types": "batch.completed"}, "event_types"),
]


@pytest.fixture
def project(app: Any, ctx: Context) -> Any:
    """A client of a project of its own (a rotated callback secret stays its own)."""
    builtin_models.register_builtin_models(ctx)
    key = auth.create_tenant(ctx, f"strict-{secrets.token_hex(3)}")[1]
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return c


def refused(got: Any, param: str) -> dict[str, Any]:
    assert got.status_code == 400, got.get_data(as_text=True)
    err: dict[str, Any] = got.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["param"]) == ("invalid_request_error", param), err
    assert err["message"].startswith(f"{param}: "), err
    return err


@pytest.mark.parametrize("route,body,param", PROJECT_CASES,
                         ids=[f"{r} {p} {i}" for i, (r, _, p) in enumerate(PROJECT_CASES)])
def test_a_value_of_another_json_type_is_a_400_naming_it(project: Any, route: str, body: Any,
                                                         param: str) -> None:
    refused(project.post(route, json=body), param)


def test_the_message_says_what_was_expected_and_what_came(project: Any) -> None:
    err = refused(project.post("/v1/chat/completions", json={**CHAT, "max_tokens": True}),
                  "max_tokens")
    assert err["message"] == "max_tokens: expected an integer, got a boolean (true)"
    err = refused(project.post("/v1/chat/completions", json={**CHAT, "temperature": "0.5"}),
                  "temperature")
    assert err["message"] == "temperature: expected a number, got a string ('0.5')"
    err = refused(project.post("/v1/embeddings", json={**EMB, "input": 5}), "input")
    assert "expected a string or an array, got an integer (5)" in err["message"]


ADMIN_CASES: list[tuple[str, Any, str]] = [
    ("/projects", {"name": "x", "weight": "2"}, "weight"),
    ("/projects", {"name": "x", "weight": 2.0}, "weight"),
    ("/projects/{p}/service_accounts", {"name": "s", "create_service_account_only": 1},
     "create_service_account_only"),
    ("/projects/{p}/service_accounts", {"name": "s", "expires_in_seconds": True},
     "expires_in_seconds"),
    ("/projects/{p}/rate_limits/rl-" + EMB_MODEL, {"max_tokens_per_1_minute": True},
     "max_tokens_per_1_minute"),
    (f"/models/{EMB_MODEL}/rollout", {"version": "1", "weight": "0.5"}, "weight"),
    (f"/models/{EMB_MODEL}/rollout", {"version": "1", "shadow": True}, "shadow"),
    (f"/models/{EMB_MODEL}/versions/1/pool", {"min_resident": "1"}, "min_resident"),
    (f"/models/{EMB_MODEL}/versions/1/pool", {"idle_unload_s": 60.0}, "idle_unload_s"),
]


@pytest.mark.parametrize("path,body,param", ADMIN_CASES,
                         ids=[f"{p} {x} {i}" for i, (p, _, x) in enumerate(ADMIN_CASES)])
def test_the_admin_api_refuses_them_too(app: Any, ctx: Context, admin_key: str, path: str,
                                        body: Any, param: str) -> None:
    builtin_models.register_builtin_models(ctx)
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {admin_key}"
    project_id = c.post("/v1/organization/projects",
                        json={"name": f"strict-{secrets.token_hex(3)}"}).get_json()["id"]
    refused(c.post("/v1/organization" + path.replace("{p}", project_id), json=body), param)


def test_the_values_clients_send_still_pass(own_settings: Settings) -> None:
    """An integer for a number, true and false for booleans, a parameter inferq does
    not implement at the value that does nothing taken and left out (on a database and
    Redis DB of its own: the jobs stay queued there)."""
    from api.app import create_app

    ctx = Context(own_settings)
    try:
        builtin_models.register_builtin_models(ctx)
        # a registry row is all validation needs: no worker runs these jobs
        files = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]
        registry.register(ctx, CHAT_MODEL, "1", "chat", "test", files, 256)
        registry.register(ctx, "shortening-embedder", "1", "embeddings", "test", files, 256,
                          matryoshka=True)  # it serves dimensions
        key = auth.create_tenant(ctx, "strict-ok")[1]
        c = create_app(own_settings).test_client()
        c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
        bodies = [
            job("/v1/chat/completions", {**CHAT, "temperature": 0, "top_p": 1,
                                         "max_tokens": 8, "seed": -3, "n": 1,
                                         "stream": False, "user": "u", "stop": ["\n"],
                                         "frequency_penalty": 0}),
            job("/v1/completions", {**PROMPT, "temperature": 0.7, "top_p": 0.9,
                                    "max_tokens": 4, "presence_penalty": 0.0}),
            job("/v1/embeddings", {"model": "shortening-embedder",
                                   "input": [[101, 2023, 102]], "dimensions": 8,
                                   "encoding_format": "base64"}),
        ]
        ids = []
        for b in bodies:
            got = c.post("/v1/jobs", json=b)
            assert got.status_code == 200, got.get_data(as_text=True)
            ids.append(got.get_json()["id"])
        with ctx.db.session() as s:
            stored = {j.id: j.body for j in s.scalars(select(Job).where(Job.id.in_(ids)))}
        chat = stored[ids[0]]
        assert chat["temperature"] == 0.0 and isinstance(chat["temperature"], float)
        assert (chat["top_p"], chat["stream"]) == (1.0, False)
        # served parameters are kept, in their types: an int stays an int, a penalty a float
        assert (chat["n"], chat["frequency_penalty"]) == (1, 0.0)
        assert isinstance(chat["n"], int) and isinstance(chat["frequency_penalty"], float)
        assert stored[ids[1]]["presence_penalty"] == 0.0
        assert stored[ids[2]]["dimensions"] == 8
        for keep in (False, True):
            got = c.post("/v1/webhook_callback_secret",
                         json={"keep_old_secret_active_for_24_hours": keep})
            assert got.status_code == 200, got.get_data(as_text=True)
    finally:
        ctx.close()
