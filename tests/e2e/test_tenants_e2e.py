"""A team's whole life on the service, driven only by the official SDK in strict mode:
the admin client creates a project and a service account, sets a rate limit, the
service account's key runs traffic against real workers until the limit answers 429,
the admin client reads that traffic back as usage billed to the key, and a revoked
key is refused with 401 at its next request."""

from __future__ import annotations

import secrets
import time
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.polling import until

MODEL = "all-MiniLM-L6-v2"
LIMIT = 3


@pytest.mark.slow
def test_project_key_limits_usage_and_revocation(stack: Any, admin_key: str) -> None:
    base = stack.base_url + "/v1"
    org = OpenAI(base_url=base, admin_api_key=admin_key, api_key="unused", max_retries=0,
                 _strict_response_validation=True, timeout=60).admin.organization
    project = org.projects.create(name=f"team-{secrets.token_hex(3)}")
    assert project.status == "active"
    account = org.projects.service_accounts.create(project.id, name="nightly-etl")
    assert account.api_key is not None
    key_id, key = account.api_key.id, account.api_key.value
    listed = org.projects.api_keys.list(project.id)
    assert [k.id for k in listed.data] == [key_id]
    assert listed.data[0].redacted_value != key and key.endswith(
        listed.data[0].redacted_value[-4:])

    limit = org.projects.rate_limits.update_rate_limit(
        f"rl-{MODEL}", project_id=project.id, max_requests_per_1_minute=LIMIT)
    assert limit.max_requests_per_1_minute == LIMIT
    assert {r.model: r.max_requests_per_1_minute
            for r in org.projects.rate_limits.list_rate_limits(project.id)}[MODEL] == LIMIT

    team = OpenAI(base_url=base, api_key=key, max_retries=0, _strict_response_validation=True,
                  timeout=60)
    start = int(time.time()) - 1
    # Limits are read with a cache of about a second in each API process.
    time.sleep(1.2)
    answers = []
    for i in range(LIMIT):
        raw = team.embeddings.with_raw_response.create(model=MODEL, input=f"row {i} of data",
                                                       encoding_format="float")
        assert raw.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        assert raw.headers["x-ratelimit-remaining-requests"] == str(LIMIT - 1 - i)
        answers.append(raw.parse())
    with pytest.raises(openai.RateLimitError) as refused:
        team.embeddings.create(model=MODEL, input="one too many", encoding_format="float")
    assert refused.value.code == "rate_limit_exceeded"
    assert int(refused.value.response.headers["retry-after"]) >= 1

    # The usage API bills exactly the admitted requests to the service account's key.
    want = (LIMIT, sum(a.usage.prompt_tokens for a in answers))

    def billed(page: Any) -> tuple[int, int]:
        rows = [r for b in page.data for r in b.results if r.api_key_id == key_id]
        return sum(r.num_model_requests for r in rows), sum(r.input_tokens for r in rows)

    page = until(lambda: org.usage.embeddings(start_time=start, project_ids=[project.id],
                                              group_by=["api_key_id"], bucket_width="1m"),
                 lambda p: billed(p) == want)
    assert billed(page) == want

    org.projects.api_keys.delete(key_id, project_id=project.id)
    with pytest.raises(openai.AuthenticationError):
        team.models.list()
    archived = org.projects.archive(project.id)
    assert archived.status == "archived" and archived.archived_at is not None
