"""Generation shards commit rows as they finish (workers/shards/rows.py), so workers
interrupted in the middle of a chat shard, with the default chunk size (one chunk
would be the whole shard), never lose the shard: every attempt commits what it
finished and the tokens its unfinished rows generated, the next resumes those rows
after them, the give-up rule never fires, and the batch ends with every row computed,
each once, equal to an undisturbed run's (greedy) and with the usage of its lines.

Real processes: PostgreSQL, Redis, the S3 server, Celery workers with SmolLM2 on the
transformers engine, killed with signals while the shard runs."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from jobs.batches import resume
from jobs.batches.views import read_shard
from jobs.core.schema import Shard
from tests.helpers import chat_line, exactly_once, jsonl, lines, shards, upload, wait
from tests.polling import until

pytestmark = pytest.mark.slow

CHAT = "SmolLM2-135M-Instruct"
# Answers of distinct lengths, the shortest first: a commit (every half second) holds
# the rows done by then and what the others generated. Each attempt is interrupted
# once a commit of its own saved more of the longest row than it was given, which
# outlasts five interruptions: five attempts resume it, each after what the one
# before it saved.
MAX_TOKENS = [2, 6, 16, 24, 26, 28, 30, 32, 192]
LONGEST = len(MAX_TOKENS) - 1
ROWS = len(MAX_TOKENS)
# The chunk size (one chunk would be the whole shard) is a deployment's default. Rows
# commit every half second rather than every 3 s, so that the interruptions land
# mid-shard with answers short enough for a CPU, and a SIGTERM stops at once (what
# finished is committed, the rest handed back: the drain that cannot finish). One torch
# thread per worker (the test runs beside others on two cores); the workers load no
# embedding model and build the chat engine at start.
WORKER = {"INFERQ_CHAT_MODEL": CHAT, "INFERQ_CHUNK_ROWS": "256",
          "INFERQ_GENERATION_COMMIT_S": "0.5", "INFERQ_DRAIN_S": "0",
          "INFERQ_TORCH_THREADS": "1", "INFERQ_EMBEDDING_MODEL": "",
          "INFERQ_PRELOAD_CHAT_MODEL": "1"}


def chat_rows() -> list[dict[str, Any]]:
    return [chat_line(i, f"Count from {i} to 500, one number per line.", CHAT, max_tokens=n)
            for i, n in enumerate(MAX_TOKENS)]


def by_id(sdk: Any, b: Any) -> dict[str, Any]:
    return {x["custom_id"]: x["response"]["body"] for x in lines(sdk, b.output_file_id)}


def holder(live: list[Any], sh: Shard) -> Any:
    """Which of the ``live`` workers runs the attempt (its lease names the pool child)."""
    pid = int((sh.worker or "").rsplit(":", 1)[-1])
    [w] = [w for w in live if os.getpgid(pid) == w.pid]
    return w


@pytest.mark.timeout(1200)  # a few minutes; more on a loaded machine
def test_five_mid_generation_interruptions_lose_no_row(fstack, fsdk, workers, fctx) -> None:  # type: ignore[no-untyped-def]
    rows = chat_rows()
    b = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                            endpoint="/v1/chat/completions", completion_window="24h")
    until(lambda: len(shards(fctx, b.id)) == 1, what="the batch to be sharded")
    [longest] = [i for i, r in enumerate(read_shard(fctx.store, shards(fctx, b.id)[0]))
                 if r["custom_id"] == f"req-{LONGEST}"]
    live: list[Any] = []
    moved: list[int] = []
    for n, sig in enumerate([signal.SIGKILL] * 4 + [signal.SIGTERM]):
        [before] = shards(fctx, b.id)
        # Before each SIGKILL a second worker stands by (its start is not what is
        # tested): the shard goes to it once the killed one's lease is handed back.
        while sig == signal.SIGKILL and len(live) < 2:
            live.append(workers(f"gen{n}-{len(live)}", **WORKER))

        def committed_some(attempt: int = before.attempt,
                           had: int = len(resume.load(fctx.store, before).get(longest, []))
                           ) -> bool:
            [sh] = shards(fctx, b.id)
            return sh.status == "running" and sh.attempt > attempt and \
                len(resume.load(fctx.store, sh).get(longest, [])) > had

        until(committed_some, timeout=600, every=0.1,
              what=f"attempt {n + 1} to commit tokens of the longest row")
        [sh] = shards(fctx, b.id)
        assert sh.rows_done < sh.rows, "the shard finished before it could be interrupted"
        # Progress by finished rows, while the shard still runs.
        moved.append(fsdk.batches.retrieve(b.id).request_counts.completed)
        w = holder(live, sh)
        if sig == signal.SIGKILL:  # the whole worker, as the OOM killer or a lost node
            os.killpg(w.pid, sig)
        else:  # a spot notice or a deploy: Celery's warm shutdown drains the shard
            os.kill(w.pid, sig)
        w.wait(120)
        live.remove(w)
    assert not live
    [sh] = shards(fctx, b.id)
    # The SIGTERM handed the shard back with what it committed: not a stall.
    assert sh.status == "queued" and sh.stalls == 0, (sh.status, sh.stalls, sh.error)
    assert 0 < moved[-1] < ROWS and moved == sorted(moved), moved
    # Each attempt resumed the longest row after what the attempt before it saved:
    # what the committed parts saved of it never shrinks, over every attempt.
    saved = [(sh.part_attempts[str(c)], len(t[longest])) for c in range(sh.chunks_done)
             if longest in (t := resume.at(fctx.store, sh, c))]
    assert len({a for a, _ in saved}) >= 5, saved
    lengths = [k for _, k in saved]
    assert lengths == sorted(lengths) and 0 < lengths[-1] < MAX_TOKENS[LONGEST], saved
    workers("last", **WORKER)
    b = wait(fsdk, b.id, timeout=900)
    assert b.status == "completed", b
    assert (b.request_counts.completed, b.request_counts.failed) == (ROWS, 0), b
    exactly_once(fsdk, b, rows)
    [sh] = shards(fctx, b.id)
    assert sh.attempt >= 6 and sh.rows_done == ROWS and sh.stalls == 0
    disturbed = by_id(fsdk, b)
    assert b.usage.input_tokens == sum(x["usage"]["prompt_tokens"] for x in disturbed.values())
    assert b.usage.output_tokens == sum(x["usage"]["completion_tokens"]
                                        for x in disturbed.values())

    # The same rows, undisturbed: the same answers (greedy), row by row.
    again = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(rows)).id,
                                endpoint="/v1/chat/completions", completion_window="24h")
    again = wait(fsdk, again.id, timeout=900)
    assert again.status == "completed" and again.request_counts.completed == ROWS
    calm = by_id(fsdk, again)
    differing = [cid for cid in calm if calm[cid]["choices"] != disturbed[cid]["choices"]]
    assert not differing, differing
