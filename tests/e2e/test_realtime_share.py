"""One project's huge realtime request does not stall another project's: project A
streams one chat with ``n`` 128 (twice the rows an engine runs at once), and project B's
small chat, sent once A's stream is under way, is answered within A's first wave of
rows (its choices all run to max_tokens, so a wave ends together); A's answer is
complete too. On both engines: the transformers engine hands a row of A's to B at its
next step, vLLM keeps the last rows for a project holding none. Without that sharing,
B waits for A's first wave to end (vLLM), or past its 30 s wait for a row (transformers:
504).

Real processes: the API, PostgreSQL, Redis, a realtime worker with the session's tiny
random Llama (SmolLM2's tokenizer) on each engine in turn."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from tests.polling import until

pytestmark = pytest.mark.slow

N = 128  # A's choices: the engine runs 64 rows (INFERQ_MAX_GENERATION_ROWS x 2)
# Each of A's choices (a random model ends on a length, not a stop): a wave of rows
# lasts this many engine steps, many times B's way through the API, while A's whole
# answer (N x A_TOKENS streamed chunks) stays short enough for a loaded CI machine.
A_TOKENS = 96


@pytest.fixture(scope="module")
def tiny_models(fctx, fvllm_tiny) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The session's tiny random Llama (``fvllm_tiny``, engine vllm) and the same stored
    files registered again with engine transformers: engine -> its name."""
    from jobs.fleet import registry

    name = "tiny-share-transformers"
    if registry.get_default(fctx, name) is None:
        m = registry.get_default(fctx, fvllm_tiny)
        assert m is not None
        registry.register(fctx, name, "1", m.kind, m.source, m.files, m.context_length,
                          object_prefix=m.object_prefix, engine=registry.TRANSFORMERS)
    return {"transformers": name, "vllm": fvllm_tiny}


def project_sdk(fstack, fctx, name: str) -> Any:  # type: ignore[no-untyped-def]
    from jobs.tenants.auth import ensure_key, new_key
    from tests.stacks import sdk_of

    key = new_key()
    ensure_key(fctx, f"{name}-{uuid.uuid4().hex[:8]}", key)
    return sdk_of(fstack, key, timeout=300)


def serving(fstack, model: str) -> bool:  # type: ignore[no-untyped-def]
    import json

    import redis

    from jobs.core.redis_keys import WORKERS

    r = redis.Redis.from_url(fstack.settings.redis_url)
    try:
        beats = [json.loads(v) for k in r.scan_iter(match=WORKERS + "*") if (v := r.get(k))]
    finally:
        r.close()
    return any(any(ref.startswith(f"{model}@") for ref in b.get("engines", {}))
               for b in beats if "realtime" in b.get("lanes", []))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_a_huge_request_of_one_project_does_not_stall_another(  # type: ignore[no-untyped-def]
        engine, fstack, fctx, workers, tiny_models) -> None:
    model = tiny_models[engine]
    workers(f"share-{engine}", "realtime", INFERQ_CHAT_MODEL=model,
            INFERQ_PRELOAD_CHAT_MODEL="true", INFERQ_EMBEDDING_MODEL="")
    until(lambda: serving(fstack, model), timeout=300, what=f"a worker serving {model}")
    a, b = project_sdk(fstack, fctx, "share-a"), project_sdk(fstack, fctx, "share-b")

    got: dict[str, Any] = {"finished": {}, "chunks": 0}
    a_started = threading.Event()

    def flood() -> None:
        try:
            stream = a.chat.completions.create(
                model=model, n=N, max_tokens=A_TOKENS, temperature=1.0, stream=True,
                messages=[{"role": "user", "content": "Write a very long story."}])
            for c in stream:
                for ch in c.choices:
                    got["chunks"] += 1
                    a_started.set()
                    if ch.finish_reason is not None:
                        got["finished"][ch.index] = ch.finish_reason
        except Exception as e:  # (its failure is this test's)
            got["error"] = e
        finally:
            got["a_done"] = time.monotonic()
            a_started.set()

    t = threading.Thread(target=flood)
    t.start()
    try:
        assert a_started.wait(300), "A's stream never began"
        assert "error" not in got, got.get("error")
        stream = b.chat.completions.create(
            model=model, max_tokens=4, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Say hello."}])
        b_text, b_reason = "", None
        for c in stream:
            if c.choices:
                b_text += c.choices[0].delta.content or ""
                b_reason = c.choices[0].finish_reason or b_reason
        b_done = time.monotonic()
        a_running, a_finished = "a_done" not in got, len(got["finished"])
    finally:
        t.join(600)
    assert not t.is_alive(), "A's stream did not end"
    assert "error" not in got, got.get("error")
    assert b_text and b_reason in ("stop", "length")
    assert a_running and b_done < got["a_done"], "B's chat waited for A's whole request"
    # A's choices all run to max_tokens, a wave of rows ending together: B was answered
    # within A's first wave, not after it (a few choices a random model ends early aside)
    assert a_finished < N // 8, f"B's chat waited for {a_finished} of A's choices to end"
    assert len(got["finished"]) == N and set(got["finished"].values()) <= {"stop", "length"}
