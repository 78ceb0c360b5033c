"""Metrics from every process: after a batch, a stream and an embeddings request through
the session stack, the API's /metrics and every worker's metrics URL (announced in its
heartbeat) hold each series, and the counts match the work done."""

from __future__ import annotations

import time
from urllib.request import Request, urlopen

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.core.context import Context
from jobs.tenants import auth
from tests.helpers import emb_line, jsonl, lines, upload
from tests.polling import until

pytestmark = pytest.mark.slow
EMB, CHAT = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
ROWS = 30
Labels = dict[str, str]


class Scrape:
    """One scrape of a metrics URL: samples by name, each (labels, value)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        with urlopen(Request(url, headers=auth), timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
        self.samples: dict[str, list[tuple[Labels, float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.samples.setdefault(s.name, []).append((s.labels, s.value))

    def names(self) -> set[str]:
        return set(self.samples)

    def value(self, name: str, **labels: str) -> float:
        """The sum over the samples of ``name`` whose labels include ``labels``."""
        return sum(v for lab, v in self.samples.get(name, [])
                   if all(lab.get(k) == x for k, x in labels.items()))

    def has(self, name: str, **labels: str) -> bool:
        return any(all(lab.get(k) == x for k, x in labels.items())
                   for lab, _ in self.samples.get(name, []))


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


@pytest.fixture(scope="module")
def urls(stack) -> dict[str, str]:  # type: ignore[no-untyped-def]
    found: dict[str, str] = stack.metrics_urls(timeout=60)
    return found


def test_every_process_announces_a_metrics_url(urls: dict[str, str], stack) -> None:  # type: ignore[no-untyped-def]
    assert urls["api"] == stack.base_url + "/metrics"
    workers = {k: v for k, v in urls.items() if k != "api"}
    assert len(workers) == 2, urls  # the control worker and the model worker
    assert sum("(control)" in k for k in workers) == 1
    for name, url in urls.items():
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        token = stack.settings.metrics_token if name == "api" else None
        assert any(n.startswith("inferq_") for n in Scrape(url, token).names())


def test_series_after_a_batch_a_stream_and_a_request(urls: dict[str, str], sdk, stack,  # type: ignore[no-untyped-def]
                                                     ctx: Context, tenant_key: str) -> None:
    project = auth.authenticate(ctx, tenant_key).tenant_id
    model_url = next(v for k, v in urls.items() if "realtime" in k)
    control_url = next(v for k, v in urls.items() if "(control)" in k)
    token = stack.settings.metrics_token

    def api_scrape() -> Scrape:
        return Scrape(urls["api"], token)

    api0, w0, c0 = api_scrape(), Scrape(model_url), Scrape(control_url)

    # The work: one batch of ROWS embeddings, one chat stream, one embeddings request and
    # one refused request, with every API call counted here.
    calls: dict[tuple[str, str, str], int] = {}

    def called(route: str, method: str = "POST", status: str = "200") -> None:
        calls[route, method, status] = calls.get((route, method, status), 0) + 1

    f = upload(sdk, jsonl([emb_line(i, f"row {i} about metrics " * (1 + i % 4))
                           for i in range(ROWS)]))
    called("/v1/files")
    b = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h")
    called("/v1/batches")
    deadline = time.monotonic() + 300
    while b.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, b
        time.sleep(0.3)
        b = sdk.batches.retrieve(b.id)
        called("/v1/batches/<batch_id>", "GET")
    assert b.status == "completed" and b.usage is not None
    out = lines(sdk, b.output_file_id)
    called("/v1/files/<file_id>/content", "GET")
    assert len(out) == ROWS

    chunks = list(sdk.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Count to five."}], temperature=0,
        max_tokens=12, stream=True, stream_options={"include_usage": True}))
    called("/v1/chat/completions")
    deltas = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert deltas >= 2 and chunks[-1].usage is not None
    completion = chunks[-1].usage.completion_tokens

    r = sdk.embeddings.create(model=EMB, input=["one request", "two inputs"],
                              encoding_format="float")
    called("/v1/embeddings")
    assert len(r.data) == 2
    with pytest.raises(Exception, match="model"):
        sdk.embeddings.create(model="no-such-model", input=["x"])
    called("/v1/embeddings", status="400")

    # The API: requests by route, latency by lane and model, errors by code.
    def api_done() -> Scrape | None:
        s = api_scrape()
        got = delta(api0, s, "inferq_api_request_seconds_count",
                    route="/v1/chat/completions", lane="realtime", model=CHAT, status="200")
        return s if got >= 1 else None

    api1 = until(api_done)
    assert api1 is not None, "the stream's request latency was never observed"
    for (route, method, status), n in calls.items():
        assert delta(api0, api1, "inferq_api_requests_total", route=route, method=method,
                     status=status) == n, (route, method, status)
    # no series names the project that did the work (its usage is in usage accounting)
    assert not [(name, lab) for name, samples in api1.samples.items()
                for lab, _ in samples if project in lab.values()]
    assert delta(api0, api1, "inferq_api_request_seconds_count", route="/v1/embeddings",
                 lane="realtime", model=EMB, status="200") == 1
    assert delta(api0, api1, "inferq_api_request_seconds_count", route="/v1/batches",
                 lane="batch", status="200") == 1
    assert delta(api0, api1, "inferq_api_errors_total", route="/v1/embeddings",
                 status="400", code="model_not_found") == 1
    assert delta(api0, api1, "inferq_api_errors_total", route="/v1/chat/completions") == 0
    for lane in ("control", "batch", "flex", "jobs"):
        assert api1.has("inferq_queue_depth", lane=lane), lane
    for model in (EMB, CHAT):
        assert api1.has("inferq_queue_depth", lane="realtime", model=model), model

    # The model worker: engine steps, micro-batches, padding, queue and stream times.
    w1 = Scrape(model_url)
    emb_steps = delta(w0, w1, "inferq_engine_step_seconds_count", engine="embeddings",
                      model=EMB)
    assert emb_steps >= 2  # the batch's and the request's micro-batches
    assert delta(w0, w1, "inferq_engine_step_rows_sum", engine="embeddings",
                 model=EMB) >= ROWS + 2
    assert delta(w0, w1, "inferq_engine_step_tokens_count", model=EMB) == emb_steps
    pad_n = delta(w0, w1, "inferq_engine_padding_efficiency_count", model=EMB)
    pad_sum = delta(w0, w1, "inferq_engine_padding_efficiency_sum", model=EMB)
    assert pad_n == emb_steps and 0 < pad_sum <= pad_n
    real = delta(w0, w1, "inferq_engine_real_tokens_total", model=EMB)
    computed = delta(w0, w1, "inferq_engine_computed_tokens_total", model=EMB)
    assert b.usage.input_tokens <= real <= computed
    gen_steps = delta(w0, w1, "inferq_engine_step_seconds_count", engine="generation",
                      model=CHAT)
    assert gen_steps >= completion  # a step gives the stream one token at most
    assert delta(w0, w1, "inferq_engine_step_seconds_sum", engine="generation",
                 model=CHAT) > 0
    assert delta(w0, w1, "inferq_time_to_first_token_seconds_count", lane="realtime",
                 model=CHAT) == 1
    assert delta(w0, w1, "inferq_inter_token_seconds_count", lane="realtime",
                 model=CHAT) == deltas - 1
    assert delta(w0, w1, "inferq_queue_seconds_count", lane="realtime", model=CHAT) == 1
    assert delta(w0, w1, "inferq_queue_seconds_count", lane="realtime", model=EMB) == 1
    assert delta(w0, w1, "inferq_queue_seconds_count", lane="batch", model=EMB) >= 1
    for kind, model in (("/v1/chat/completions", CHAT), ("/v1/embeddings", EMB)):
        assert delta(w0, w1, "inferq_worker_requests_total", lane="realtime", model=model,
                     kind=kind, outcome="ok") == 1
        assert delta(w0, w1, "inferq_inference_seconds_count", lane="realtime", model=model,
                     kind=kind) == 1
        assert delta(w0, w1, "inferq_inference_seconds_sum", lane="realtime", model=model,
                     kind=kind) > 0
    assert delta(w0, w1, "inferq_batch_rows_total", lane="batch", model=EMB,
                 result="ok") >= ROWS
    assert delta(w0, w1, "inferq_accelerator_seconds_total", lane="batch", model=EMB) > 0
    assert delta(w0, w1, "inferq_shards_total", lane="batch", outcome="done") >= 1
    assert w1.value("inferq_shards_in_flight", lane="batch") == 0
    assert w1.has("inferq_retries_total", what="shard:retry")
    assert delta(w0, w1, "inferq_retries_total") == 0
    assert w1.value("inferq_breaker_state", inferq_breaker_state="closed") == 1
    assert w1.value("inferq_breaker_state", inferq_breaker_state="open") == 0
    assert delta(w0, w1, "inferq_engine_rows_total", engine="embeddings", lane="batch") >= ROWS
    assert delta(w0, w1, "inferq_engine_rows_total", engine="embeddings", lane="realtime") == 2
    assert delta(w0, w1, "inferq_generation_tokens_total", model=CHAT,
                 lane="realtime") == completion

    # The control worker: the janitor's repairs (none here).
    c = Scrape(control_url)
    for name in ("inferq_leases_lapsed_total", "inferq_janitor_shards_failed_total",
                 "inferq_janitor_batches_expired_total"):
        assert c.has(name), name
        assert delta(c0, c, name) == 0, name
    assert c.has("inferq_retries_total", what="task:inferq.validate_batch")

    # Accelerator series only where there is an accelerator: absent, not zero, without.
    import torch

    gpu = {n for n in w1.names() if n.startswith(("inferq_accelerator_memory",
                                                  "inferq_accelerator_util"))}
    if torch.cuda.is_available():
        assert w1.value("inferq_accelerator_memory_total_bytes") > 0
        assert w1.value("inferq_accelerator_memory_allocated_bytes") > 0
    else:
        assert not gpu, gpu
    for s in (api1, c):
        assert not {n for n in s.names() if n.startswith("inferq_accelerator_memory")}
