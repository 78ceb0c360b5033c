"""The pure arithmetic of the rate limits (jobs/tenants/limits.py, token_counts.py): token
estimates, the reset format, limits over defaults, reading usage from a worker's answer.
The decisions themselves run in Redis (tests/e2e/test_limits.py)."""

from __future__ import annotations

import orjson
import pytest

from jobs.core.access_tables import RateLimit
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from jobs.tenants import limits, token_counts
from jobs.tenants.limits import Limits, Window


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0ms"), (20, "20ms"), (999, "999ms"), (1000, "1s"), (1500, "1.5s"), (1234, "1.234s"),
    (59_999, "59.999s"), (60_000, "1m0s"), (360_000, "6m0s"), (61_500, "1m1.5s"),
    (3_600_000, "1h0m0s"), (3_723_000, "1h2m3s"), (-5, "0ms")])
def test_reset_is_written_as_openai_does(ms: int, text: str) -> None:
    assert limits.duration(ms) == text


def test_token_ids_are_counted_exactly_with_the_special_tokens() -> None:
    assert token_counts.embedding_tokens([[1, 2, 3]]) == 3 + token_counts.EMBEDDING_SPECIAL_TOKENS
    assert token_counts.prompt_tokens(EMBEDDINGS, {"input": [5, 6]}) == 2 + 2
    assert token_counts.prompt_tokens(EMBEDDINGS, {"input": [[5, 6], [7]]}) == (2 + 2) + (1 + 2)


def test_a_text_is_bounded_by_its_utf8_bytes() -> None:
    assert token_counts.prompt_tokens(EMBEDDINGS, {"input": "héllo"}) == 6 + 2  # é is 2 bytes
    assert token_counts.prompt_tokens(EMBEDDINGS, {"input": ["ab", "日本"]}) == (2 + 2) + (6 + 2)


def test_generation_reserves_prompt_bound_plus_max_tokens_or_the_default() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo",
                                                             "name": "me"}]}
    prompt = (token_counts.PROMPT_OVERHEAD_TOKENS + 2 * token_counts.MESSAGE_OVERHEAD_TOKENS
              + 2 + 2 + 2)
    assert token_counts.prompt_tokens(CHAT, chat) == prompt
    assert token_counts.request_tokens(CHAT, chat, 1024) == prompt + 1024
    assert token_counts.request_tokens(CHAT, {**chat, "max_tokens": 7}, 1024) == prompt + 7
    assert token_counts.request_tokens(CHAT, {**chat, "max_completion_tokens": 9},
                                       1024) == prompt + 9
    completion = {"prompt": "abc", "max_tokens": 5}
    assert token_counts.request_tokens(COMPLETIONS, completion, 1024) == (
        token_counts.PROMPT_OVERHEAD_TOKENS + 3 + 5)
    assert token_counts.request_tokens(EMBEDDINGS, {"input": "abc"}, 1024) == 3 + 2  # no output


def test_a_null_column_takes_the_default_and_no_row_is_all_defaults() -> None:
    default = Limits(10, 20, 30, 40, 50)
    assert limits.from_row(None, default) == default
    row = RateLimit(tenant_id="t", model="m", max_requests_per_1_minute=3,
                    max_tokens_per_1_minute=None, max_requests_per_1_day=0,
                    batch_1_day_max_input_tokens=None, max_concurrent_streams=2)
    assert limits.from_row(row, default) == Limits(3, 20, 0, 40, 2)


def test_headers_name_the_minute_windows_only() -> None:
    h = limits.headers_for([Window("requests", 10, 7, 6000), Window("tokens", 1000, -3, 250),
                            Window("requests_day", 5, 1, 80_000_000)])
    assert h == {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "7",
                 "x-ratelimit-reset-requests": "6s", "x-ratelimit-limit-tokens": "1000",
                 "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "250ms"}


def test_usage_is_read_from_the_tail_of_a_workers_answer() -> None:
    body = orjson.dumps({"object": "list", "data": [{"embedding": [0.5] * 4, "usage": "x"}],
                         "model": "m", "usage": {"prompt_tokens": 12, "total_tokens": 12}})
    assert token_counts.body_usage_tokens(body) == 12
    assert token_counts.body_usage_tokens(b'{"object": "list"}') is None
    assert token_counts.usage_tokens({"prompt_tokens": 4, "completion_tokens": 6}) == 10
    assert token_counts.usage_tokens(None) is None
