"""The failure matrix (docs/RELIABILITY.md) against real processes: PostgreSQL, Redis,
the S3 server, and Celery workers that are killed with signals. Every case checks
that each custom_id appears exactly once across the output and error files, and that
recomputed rows stayed within one chunk per interruption."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from typing import Any

import pytest

from tests.conftest import CHUNK
from tests.helpers import (
    computed,
    emb_line,
    embedding_lines,
    exactly_once,
    jsonl,
    lines,
    recomputed,
    shards,
    upload,
    wait,
)
from tests.polling import until

pytestmark = pytest.mark.slow


def worker_stats(fstack, engine: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """An engine's counters from the heartbeat of the one worker running it."""
    import json

    import redis

    r = redis.Redis.from_url(fstack.settings.redis_url)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for key in r.scan_iter(match="inferq:workers:*"):
            stats = json.loads(r.get(key) or "{}").get("stats", {})
            if engine in stats:
                return dict(stats[engine])
        time.sleep(0.5)
    raise TimeoutError(f"no worker reports a {engine} engine")


def test_kill_9_mid_shard_resumes_elsewhere(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    rows = embedding_lines(800)
    first = workers("k1")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    until(lambda: any(s.chunks_done >= 2 and s.status == "running"
                         for s in shards(fctx, b.id)), what="a shard in progress")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    workers("k2")
    b = wait(fsdk, b.id, timeout=300)
    assert b.status == "completed" and b.request_counts.completed == 800
    exactly_once(fsdk, b, rows)
    assert max(s.attempt for s in shards(fctx, b.id)) >= 2
    assert 0 <= recomputed(fctx, b.id, 800) <= CHUNK


def test_a_worker_with_another_chunk_size_resumes_exactly(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    """The checkpoint is a row count: a shard begun by a worker with one
    INFERQ_CHUNK_ROWS and resumed by one with another (a rolling config change)
    neither skips nor repeats a request."""
    rows = embedding_lines(400)
    first = workers("chunk40")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    until(lambda: any(s.chunks_done >= 2 and s.status == "running"
                         for s in shards(fctx, b.id)), what="a shard in progress")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    workers("chunk100", INFERQ_CHUNK_ROWS="100")
    b = wait(fsdk, b.id, timeout=300)
    assert b.status == "completed" and b.request_counts.completed == 400
    exactly_once(fsdk, b, rows)
    assert 0 <= recomputed(fctx, b.id, 400) <= CHUNK


def in_progress(fctx, batch_id: str, commits: int) -> None:  # type: ignore[no-untyped-def]
    """Waits for a shard of the batch running with ``commits`` commits behind it; fails
    at once when every shard has finished first (the moment to interrupt one passed)."""
    def seen() -> str:
        now = shards(fctx, batch_id)
        if any(s.chunks_done >= commits and s.status == "running" for s in now):
            return "running"
        if now and all(s.status == "done" for s in now):
            return "done"
        return ""

    got = until(seen, timeout=300, what="a shard in progress")
    assert got == "running", "every shard finished before one could be interrupted"


def sigterm_drains(fsdk, workers, fctx, rows, endpoint: str, **env: str) -> None:  # type: ignore[no-untyped-def]
    """A spot worker told SIGTERM in the middle of a flex shard drains within the notice:
    the chunk in flight committed, the rest handed back; another finishes the batch,
    every line once, none computed twice."""
    spot = workers("spot1", "flex", INFERQ_SPOT="1", **env)
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint=endpoint, completion_window="24h",
                            extra_body={"service_tier": "flex"})
    in_progress(fctx, b.id, commits=1)
    t0 = time.monotonic()
    os.kill(spot.pid, signal.SIGTERM)
    spot.wait(60)
    drained_in = time.monotonic() - t0
    assert drained_in < 20, f"drain took {drained_in:.1f}s, past the notice"
    after = shards(fctx, b.id)
    assert all(s.status in ("queued", "done") for s in after), [s.status for s in after]
    assert any(s.status == "queued" and s.chunks_done > 0 for s in after)  # checkpointed
    workers("spot2", "flex", INFERQ_SPOT="1", **env)
    b = wait(fsdk, b.id, timeout=600)
    assert b.status == "completed"
    exactly_once(fsdk, b, rows)
    assert recomputed(fctx, b.id, len(rows)) == 0  # the chunk in flight was committed


def test_sigterm_drains_and_hands_back_at_a_chunk(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    sigterm_drains(fsdk, workers, fctx, embedding_lines(800), "/v1/embeddings")


def chat_rows(n: int, model: str) -> list[dict[str, Any]]:
    from tests.helpers import chat_line

    return [chat_line(i, f"Tell a story about the number {i}.", model, max_tokens=16)
            for i in range(n)]


def test_kill_9_mid_generation_shard_on_vllm_resumes_elsewhere(  # type: ignore[no-untyped-def]
        fstack, fsdk, workers, fctx, fvllm_tiny) -> None:
    """The vLLM engine under the same leases, fencing and checkpoints: a worker killed
    in the middle of a chat shard, another finishing it, each line exactly once."""
    rows = chat_rows(800, fvllm_tiny)
    # Generation commits by time: every 0.2 s here, so a shard of this tiny model (a
    # few seconds) is caught between commits.
    env = {"INFERQ_CHAT_MODEL": fvllm_tiny, "INFERQ_PRELOAD_CHAT_MODEL": "true",
           "INFERQ_GENERATION_COMMIT_S": "0.2"}
    first = workers("vk1", **env)
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/chat/completions", completion_window="24h")
    in_progress(fctx, b.id, commits=2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    workers("vk2", **env)
    b = wait(fsdk, b.id, timeout=600)
    assert b.status == "completed" and b.request_counts.completed == 800, b
    exactly_once(fsdk, b, rows)
    assert max(s.attempt for s in shards(fctx, b.id)) >= 2
    # The kill costs the rows finished since the last commit (0.2 s of this tiny
    # model's rows: tens of rows, 80 seen on a loaded machine), not the shard's.
    assert 0 <= recomputed(fctx, b.id, 800) < 800 // 4
    assert all(o["response"]["body"]["usage"]["completion_tokens"] > 0
               for o in lines(fsdk, b.output_file_id))


def test_sigterm_drains_a_vllm_worker_at_a_chunk(  # type: ignore[no-untyped-def]
        fstack, fsdk, workers, fctx, fvllm_tiny) -> None:
    sigterm_drains(fsdk, workers, fctx, chat_rows(800, fvllm_tiny), "/v1/chat/completions",
                   INFERQ_CHAT_MODEL=fvllm_tiny, INFERQ_PRELOAD_CHAT_MODEL="true",
                   INFERQ_GENERATION_COMMIT_S="0.2")


def redeliver(fctx, shard_id: str) -> str:  # type: ignore[no-untyped-def]
    """Sends the shard's task once more, as a broker redelivery would; returns the
    message's task id."""
    from jobs.core.dispatch import TASK_SHARD

    task_id = f"redelivery-{uuid.uuid4()}"
    fctx.dispatcher.app.send_task(TASK_SHARD, args=[shard_id], queue="batch", task_id=task_id)
    return task_id


def task_outcome(fstack, task_id: str, timeout: float = 60) -> str:  # type: ignore[no-untyped-def]
    """What a worker's shard task returned for the message ``task_id`` (the pipeline's
    outcome), read from the line Celery logs when the task returns."""
    found: list[str] = []

    def returned() -> bool:
        for log in fstack.log_dir.glob("worker-*.log"):
            m = re.search(rf"\[{re.escape(task_id)}\] succeeded in [0-9.e-]+s: '(\w+)'",
                          log.read_text(errors="replace"))
            if m:
                found.append(m.group(1))
                return True
        return False

    until(returned, timeout=timeout, what=f"task {task_id} to return")
    return found[0]


def test_duplicate_delivery_is_a_no_op(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    """What a visibility timeout shorter than a shard causes: a second delivery of a
    running (or finished) shard's message finds the lease taken and does nothing."""
    rows = embedding_lines(400)
    workers("d1")
    workers("d2")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    until(lambda: any(s.status == "running" for s in shards(fctx, b.id)),
             what="the shard running")
    sid = shards(fctx, b.id)[0].id
    while_running = [redeliver(fctx, sid) for _ in range(3)]
    b = wait(fsdk, b.id, timeout=300)
    assert b.status == "completed"
    exactly_once(fsdk, b, rows)
    assert shards(fctx, b.id)[0].attempt == 1
    after_done = redeliver(fctx, sid)  # and once more after it finished
    # Each copy was taken and returned without claiming the shard.
    assert [task_outcome(fstack, t) for t in [*while_running, after_done]] == ["duplicate"] * 4
    assert shards(fctx, b.id)[0].attempt == 1 and recomputed(fctx, b.id, 400) == 0


def test_expired_batch_keeps_finished_results(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    from jobs.core.schema import Batch

    rows = embedding_lines(1200)
    workers("e1")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    until(lambda: any(s.chunks_done >= 1 for s in shards(fctx, b.id)), what="progress")
    with fctx.db.session() as s:
        s.get(Batch, b.id).expires_at = 0  # the window has passed
    b = wait(fsdk, b.id, timeout=120)
    assert b.status == "expired", b.status
    exactly_once(fsdk, b, rows)
    errs = lines(fsdk, b.error_file_id)
    assert errs and {e["error"]["code"] for e in errs} == {"batch_expired"}
    assert b.request_counts.completed == len(lines(fsdk, b.output_file_id)) > 0


def test_cancel_stops_running_shards_within_a_chunk(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    rows = embedding_lines(1600)
    workers("c1")
    workers("c2")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    until(lambda: sum(s.chunks_done for s in shards(fctx, b.id)) >= 2
             and any(s.status == "running" for s in shards(fctx, b.id)), what="progress")
    running = sum(s.status == "running" for s in shards(fctx, b.id))
    at_cancel = computed(fctx, b.id)
    assert fsdk.batches.cancel(b.id).status == "cancelling"
    b = wait(fsdk, b.id, timeout=120)
    assert b.status == "cancelled"
    exactly_once(fsdk, b, rows)
    out, errs = lines(fsdk, b.output_file_id), lines(fsdk, b.error_file_id)
    assert len(out) == b.request_counts.completed >= at_cancel > 0  # results so far kept
    assert errs and {e["error"]["code"] for e in errs} == {"batch_cancelled"}
    # Each running shard finished at most the chunk it was computing.
    assert computed(fctx, b.id) - at_cancel <= CHUNK * running


def test_object_store_errors_mid_batch_are_retried(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    """Case 6 with real processes: the workers reach S3 through a proxy that throttles
    (503 SlowDown) or drops about one request in five, in bursts that outlast
    botocore's own retries. Nothing is lost or written twice, and results are only
    recomputed when a whole shard attempt gave up, one chunk at most each time."""
    from tests.flaky_proxy import FlakyProxy

    rows = embedding_lines(800)
    with FlakyProxy(os.environ["AWS_ENDPOINT_URL"], every=40, burst=7, single=6) as proxy:
        workers("flaky1", AWS_ENDPOINT_URL=proxy.url)
        workers("flaky2", AWS_ENDPOINT_URL=proxy.url)
        b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                                endpoint="/v1/embeddings", completion_window="24h")
        b = wait(fsdk, b.id, timeout=300)
        injected = proxy.throttled + proxy.dropped
    assert b.status == "completed" and b.request_counts.completed == 800, b
    exactly_once(fsdk, b, rows)
    assert injected >= 10 and proxy.forwarded > 0, (proxy.throttled, proxy.dropped)
    got = shards(fctx, b.id)
    retried_attempts = sum(s.attempt for s in got) - len(got)
    assert 0 <= recomputed(fctx, b.id, 800) <= CHUNK * retried_attempts


def test_out_of_memory_splits_and_fails_one_item_alone(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    rows = embedding_lines(200)
    rows.append(emb_line("huge", "a very long sentence about everything " * 40))  # 242 tokens
    workers("oom", INFERQ_FAULT_OOM_ABOVE_TOKENS="200")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    b = wait(fsdk, b.id, timeout=300)
    assert b.status == "completed"
    exactly_once(fsdk, b, rows)
    errs = lines(fsdk, b.error_file_id)
    assert [e["custom_id"] for e in errs] == ["req-huge"]
    assert errs[0]["response"]["status_code"] == 413
    assert errs[0]["response"]["body"]["error"]["code"] == "request_too_large"
    assert "does not fit" in errs[0]["response"]["body"]["error"]["message"]
    assert b.request_counts.completed == 200


def test_generation_out_of_memory_preempts_and_fails_alone(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    """The chat engine under injected OOM (rows x cache width above 400 tokens): decode
    steps that do not fit send sequences back to the queue, which resume where they
    were; the one prompt that does not fit even alone fails by itself."""
    from tests.helpers import chat_line

    chat = "SmolLM2-135M-Instruct"
    rows = [chat_line(i, f"Name a colour, number {i}.", chat, max_tokens=12)
            for i in range(12)]
    rows.insert(5, chat_line("huge", "Tell me about " + "the weather " * 300, chat,
                             max_tokens=4))
    workers("chat-oom", INFERQ_CHAT_MODEL=chat, INFERQ_FAULT_OOM_ABOVE_TOKENS="400",
            INFERQ_WORKER_HEARTBEAT_S="1")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/chat/completions", completion_window="24h")
    b = wait(fsdk, b.id, timeout=300)
    assert b.status == "completed", b
    exactly_once(fsdk, b, rows)
    errs = lines(fsdk, b.error_file_id)
    assert [e["custom_id"] for e in errs] == ["req-huge"]
    assert errs[0]["response"]["status_code"] == 413
    assert "does not fit" in errs[0]["response"]["body"]["error"]["message"]
    outs = lines(fsdk, b.output_file_id)
    assert len(outs) == 12
    assert all(o["response"]["body"]["usage"]["completion_tokens"] > 0 for o in outs)
    # The heartbeat publishes the engine's counters every second.
    until(lambda: worker_stats(fstack, "generation")["oom_failures"] == 1, timeout=15,
             what="the worker to report the failure")
    assert worker_stats(fstack, "generation")["preemptions"] > 0


def test_a_failing_model_stops_its_worker_not_the_batch(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    import json

    import redis

    rows = embedding_lines(400)
    broken = workers("broken", INFERQ_FAULT_MODEL_FAILS="1", INFERQ_BREAKER_THRESHOLD="1",
                     INFERQ_BREAKER_COOLDOWN_S="120")
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/embeddings", completion_window="24h")
    r = redis.Redis.from_url(fstack.settings.redis_url)

    def breaker_open() -> bool:
        for key in r.scan_iter(match="inferq:workers:*"):
            info = json.loads(r.get(key) or "{}")
            if info.get("breaker") == "open":
                return True
        return False

    until(breaker_open, timeout=120, what="the broken worker's breaker to open")
    assert broken.poll() is None  # alive, but taking no work
    workers("healthy")
    b = wait(fsdk, b.id, timeout=300)
    assert b.status == "completed" and b.request_counts.failed == 0
    exactly_once(fsdk, b, rows)
