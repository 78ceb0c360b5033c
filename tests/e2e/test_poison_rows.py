"""Requests at the extremes of the accepted sampling parameters (temperature or top_p
of 1e-300, 5e-324), sent by one project while another project's realtime requests, job
and batch shard run on the same chat engine (the real SmolLM2-135M-Instruct): every
request of both projects is answered, the extreme ones as greedy decoding answers
them, and every line of the batch is computed."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from tests.helpers import chat_line, jsonl, lines, upload, wait

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
EXTREMES: list[dict[str, Any]] = [
    {"temperature": 1e-300}, {"temperature": 1e-300, "seed": 3}, {"temperature": 5e-324},
    {"temperature": 1.0, "top_p": 1e-300}, {"temperature": 2.0, "top_p": 5e-324},
    {"temperature": 1e-300, "top_p": 1e-300}]


def question(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Name a colour, number {i}."}]


def project_sdk(stack: Any, key: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=stack.base_url + "/v1", api_key=key,
                  _strict_response_validation=True, max_retries=0, timeout=120)


def create_job(stack: Any, key: str, body: dict[str, Any]) -> str:
    req = urllib.request.Request(
        stack.base_url + "/v1/jobs", method="POST",
        data=json.dumps({"endpoint": "/v1/chat/completions", "body": body}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return str(json.loads(r.read())["id"])


def job(stack: Any, key: str, job_id: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        req = urllib.request.Request(stack.base_url + f"/v1/jobs/{job_id}",
                                     headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            j: dict[str, Any] = json.loads(r.read())
        if j["status"] in ("completed", "failed"):
            return j
        time.sleep(0.3)
    raise TimeoutError(f"job {job_id} did not end in {timeout}s")


def test_extreme_sampling_parameters_are_served_beside_other_projects_work(
        stack: Any, tenant_key: str, other_tenant_key: str) -> None:
    a, b = project_sdk(stack, tenant_key), project_sdk(stack, other_tenant_key)
    rows = [chat_line(f"a{i}", f"Count to {i % 5 + 1}.", MODEL) for i in range(40)]
    batch = a.batches.create(input_file_id=upload(a, jsonl(rows)).id,
                             endpoint="/v1/chat/completions", completion_window="24h")
    job_id = create_job(stack, tenant_key, {"model": MODEL, "max_tokens": 8,
                                            "temperature": 0, "messages": question(99)})
    wait(a, batch.id, until=("in_progress", "completed", "failed"))

    answers: dict[str, Any] = {}

    def ask(sdk: Any, name: str, i: int, params: dict[str, Any]) -> None:
        try:
            answers[name] = sdk.chat.completions.create(model=MODEL, messages=question(i),
                                                        max_tokens=8, **params)
        except Exception as e:  # noqa: BLE001 - asserted below
            answers[name] = e

    calls = [(b, f"b{i}", i, p) for i, p in enumerate(EXTREMES)] + [
        (a, f"a{i}", 10 + i, {"temperature": 0}) for i in range(4)]
    threads = [threading.Thread(target=ask, args=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    failed = sorted(k for k, v in answers.items() if isinstance(v, Exception))
    assert len(answers) == len(calls) and not failed, (failed, answers[failed[0]])

    done = wait(a, batch.id)
    assert done.status == "completed" and done.request_counts.failed == 0, done
    out = lines(a, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(r["custom_id"] for r in rows)
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert lines(a, done.error_file_id) == []
    j = job(stack, tenant_key, job_id)
    assert j["status"] == "completed" and j["result"]["choices"][0]["message"]["content"]

    for i, _ in enumerate(EXTREMES):  # nothing but the top token is left: greedy
        greedy = b.chat.completions.create(model=MODEL, messages=question(i), max_tokens=8,
                                           temperature=0)
        assert answers[f"b{i}"].choices[0].message.content == \
            greedy.choices[0].message.content, EXTREMES[i]
