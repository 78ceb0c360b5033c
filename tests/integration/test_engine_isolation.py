"""One model cannot break another on a worker (the worker's residency and breaker, in
this process, over the session's PostgreSQL, Redis and S3 server):

- SmolLM2 runs on the vLLM engine; a tiny Llama that vLLM's CPU attention cannot run
  (head_dim 16) is added beside it and falls back to the transformers engine: both keep
  answering, and a batch on SmolLM2 completes with every row computed;
- vLLM's engine core killed in the middle of a batch's rows: the breaker opens before
  the rows fail (so the shard pipeline hands them back rather than writing them as
  failed rows), the version leaves what the worker announces, its engine is built
  again, and the batch then completes with every row computed."""

from __future__ import annotations

import io
import os
import shutil
import signal
import time
from typing import Any

import pytest

from jobs.core.status import BreakerState
from jobs.fleet import own_models, registry
from jobs.protocol.endpoints import CHAT
from tests.helpers import chat_line, jsonl
from tests.polling import until
from workers.engines.request import build_request
from workers.engines.sinks import Collect

pytestmark = pytest.mark.slow

SMOL = "SmolLM2-135M-Instruct"
TINY = f"tiny-head16-{int(time.time() * 1000) % 10**8}"


@pytest.fixture(scope="module")
def worker(ctx, settings, tenant_key, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A worker's residency and breaker where versions registered as auto run on vLLM
    where it can (SmolLM2 does), with SmolLM2 and the tiny Llama registered."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from workers.models.cache import tokenizer_dir
    from workers.models.importers import import_model
    from workers.models.residency import Residency
    from workers.process.breaker import Breaker
    from workers.process.runtime import Loader, WorkerRuntime

    smol = registry.get_default(ctx, SMOL) or import_model(ctx, SMOL)
    path = tmp_path_factory.mktemp("tiny-head16") / "model"
    shutil.copytree(tokenizer_dir(ctx, smol), path,
                    ignore=shutil.ignore_patterns("config.json", ".*"))
    tok = AutoTokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(  # hidden 64, 4 heads: head_dim 16
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)).save_pretrained(str(path))
    own_models.add(ctx, TINY, str(path), "chat")  # auto: vLLM where it can
    st = settings.model_copy(update={"auto_engine": registry.VLLM, "chat_model": ""})
    breaker = Breaker(threshold=3, cooldown_s=15.0)
    residency = Residency(ctx, Loader(ctx, st, breaker), worker="isolation-test")
    rt = WorkerRuntime(st, ctx, "isolation-test", breaker, residency, "cpu")
    yield rt
    residency.stop()


def ask(engine: Any, content: str, prio: int = 0, max_tokens: int = 8) -> Collect:
    c = Collect()
    engine.submit(build_request(engine.model, CHAT, {
        "model": engine.model.model_id, "temperature": 0, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}]}), c, prio)
    return c


def run_batch(client: Any, rt: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat batch sent through the API, its shards run on ``rt`` until none is left
    (a shard handed back is run again), finalized: the batch as the API shows it. An
    engine being built again sets this process's Flask context proxies aside a while
    (the S3 server of the tests runs on Flask here; a worker has none): the shards wait
    for the build."""
    from jobs.batches import finalize, service
    from jobs.batches import queries as repo
    from workers.lanes.batch import run_shard

    fid = client.post("/v1/files", content_type="multipart/form-data", data={
        "file": (io.BytesIO(jsonl(rows)), "in.jsonl"), "purpose": "batch"}).get_json()["id"]
    b = client.post("/v1/batches", json={"input_file_id": fid, "completion_window": "24h",
                                         "endpoint": "/v1/chat/completions"})
    assert b.status_code == 200, b.get_data(as_text=True)
    batch_id = b.get_json()["id"]
    service.validate_batch(rt.ctx, batch_id)
    deadline = time.monotonic() + 900
    while True:
        with rt.ctx.db.session() as s:
            left = [sh.id for sh in repo.shards_of(s, batch_id)
                    if sh.status not in ("done", "failed", "cancelled")]
        if not left:
            break
        assert time.monotonic() < deadline, "the batch's shards did not finish"
        until(rt.breaker.allow, timeout=60, what="the breaker to let work in")
        until(lambda: not rt.residency.snapshot()["rebuilding"], timeout=900,
              what="no engine being built again")
        for sid in left:
            run_shard(rt, sid, lambda: False)
    finalize.finalize_batch(rt.ctx, batch_id)
    return dict(client.get(f"/v1/batches/{batch_id}").get_json())


def test_a_model_vllm_cannot_run_leaves_the_one_it_runs_answering(worker, client) -> None:  # type: ignore[no-untyped-def]
    res = worker.residency
    m = registry.get_default(worker.ctx, SMOL)
    assert m is not None
    smol = res.load(f"{SMOL}@{m.version}", "placed")
    assert smol.generation is not None and smol.generation.name == "vllm"
    before = ask(res.chat(SMOL), "What is the capital of France?").result(300)
    assert before.usage.completion_tokens > 0

    tiny = res.load(f"{TINY}@1", "placed")  # vLLM fails to build it: transformers serves it
    assert tiny.generation is not None and tiny.generation.name == "transformers"
    assert ask(res.chat(TINY), "hi", max_tokens=4).result(300).usage.completion_tokens > 0

    after = ask(res.chat(SMOL), "What is the capital of France?").result(300)
    assert after.text == before.text  # the same engine, unharmed
    assert worker.describe()["engines"] == {smol.ref: "vllm", tiny.ref: "transformers"}
    assert worker.breaker.state == BreakerState.CLOSED

    rows = [chat_line(i, f"Say something about the number {i}.", SMOL) for i in range(40)]
    b = run_batch(client, worker, rows)
    assert b["status"] == "completed", b
    assert b["request_counts"] == {"total": 40, "completed": 40, "failed": 0}, b


def test_a_broken_engine_trips_the_breaker_and_is_built_again(worker, client) -> None:  # type: ignore[no-untyped-def]
    """vLLM's engine core is killed while a batch's rows run on it."""
    res = worker.residency
    smol = res.find(SMOL)
    gen = res.chat(SMOL)
    pids = gen.core_pids()
    assert pids and os.getpid() not in pids  # its core: a process of its own
    opened: list[float] = []
    worker.breaker.on_open.append(opened.append)

    def kill_when_running() -> None:
        until(lambda: gen.load()[0] > 0, timeout=600, what="rows running on vLLM")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    import threading

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    rows = [chat_line(i, f"Tell a story about the number {i}.", SMOL, max_tokens=48)
            for i in range(60)]
    b = run_batch(client, worker, rows)
    killer.join()
    assert opened, "the breaker did not open"
    assert gen.broken is not None and res.chat(SMOL) is not gen  # built again
    assert b["status"] == "completed", b
    assert b["request_counts"] == {"total": 60, "completed": 60, "failed": 0}, b
    assert smol.ref in res.refs() and worker.describe()["engines"][smol.ref] == "vllm"
    # the tiny Llama on the transformers engine was not touched
    assert ask(res.chat(TINY), "hi", max_tokens=4).result(300).usage.completion_tokens > 0


def test_a_broken_engine_leaves_what_the_worker_announces(worker) -> None:  # type: ignore[no-untyped-def]
    """Until it is built again, the version is not announced as held and its engine is
    not reported; realtime requests sent to it meanwhile fail as the server's (503)."""
    res = worker.residency
    smol = res.find(SMOL)
    gen = res.chat(SMOL)
    for pid in gen.core_pids():
        os.kill(pid, signal.SIGKILL)
    failed = ask(gen, "hi")
    with pytest.raises(Exception) as e:
        failed.result(120)
    assert getattr(e.value, "status", None) == 503, e.value
    until(lambda: smol.ref not in res.refs() or res.chat(SMOL) is not gen, timeout=120,
          what="the broken version to leave the announcement")
    if smol.ref not in res.refs():
        assert smol.ref not in worker.describe()["engines"]
        assert smol.ref in worker.describe()["residency"]["rebuilding"]
    until(lambda: smol.ref in res.refs(), timeout=900, what="the engine built again")
    assert ask(res.chat(SMOL), "hi", max_tokens=4).result(300).usage.completion_tokens > 0
