"""Choices and what shapes them, in the generation engine on the real builtin chat model
(SmolLM2-135M-Instruct): logit_bias, presence and frequency penalties, log
probabilities (chat and completions, streamed or not), n, best_of and echo; each one's
effect seen in the output, the bodies the responses are built into accepted by the
openai SDK's types, and a fanned-out request that fails or is cancelled failing or
leaving alone (on the tiny model)."""

from __future__ import annotations

import copy
import math
from typing import Any

import orjson
import pytest
import torch
from openai._models import construct_type
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from jobs.core.errors import InvalidRequest
from jobs.core.settings import default_cache_dir
from jobs.protocol.endpoints import CHAT, COMPLETIONS
from jobs.protocol.shapes import ChunkWriter
from workers.engines.generation.engine import GenerationEngine
from workers.engines.prefix_cache import PrefixCache
from workers.engines.request import GenRequest, build_request
from workers.engines.responses import generation_body, top_count
from workers.engines.sinks import Collect, Usage
from workers.engines.token_texts import TokenTexts
from workers.models.chat import ChatModel

SMOL = "SmolLM2-135M-Instruct"
REPEAT = [{"role": "user", "content": "Name three animals."}]


@pytest.fixture(scope="module")
def smol() -> ChatModel:
    from workers.models.importers import converted_dir, smollm2_gguf

    return ChatModel(SMOL, converted_dir(default_cache_dir(), SMOL, "1", smollm2_gguf()))


@pytest.fixture(scope="module")
def engine(smol: ChatModel):  # type: ignore[no-untyped-def]
    e = GenerationEngine(smol, prefix_cache=PrefixCache(64 << 20))
    yield e
    e.stop()


def answer(engine: GenerationEngine, endpoint: str, body: dict[str, Any]
           ) -> tuple[dict[str, Any], Collect]:
    body = {"model": SMOL, **body}
    c = Collect()
    engine.submit(build_request(engine.model, endpoint, body), c, 2)
    c.result(timeout=300)
    out = generation_body(endpoint, SMOL, c.choices, top_count(endpoint, body),
                          c.usage.prompt_tokens, c.usage.completion_tokens)
    sdk_strict(endpoint, out)
    return out, c


def sdk_strict(endpoint: str, out: dict[str, Any]) -> None:
    """The SDK's types, validated strictly, take the body: all of it but an echo's first
    token, whose log probability is null as OpenAI's is (the SDK's type says a number;
    its client does not validate, and reads the null as None)."""
    strict = copy.deepcopy(out)
    for ch in strict["choices"]:
        lp = ch.get("logprobs")
        if endpoint == COMPLETIONS and lp and lp["token_logprobs"][:1] == [None]:
            for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                if lp[k] is not None:
                    del lp[k][0]
    (ChatCompletion if endpoint == CHAT else Completion).model_validate(strict)
    assert construct_type(type_=Completion if endpoint == COMPLETIONS else ChatCompletion,
                          value=out) is not None


def chat(engine: GenerationEngine, **body: Any) -> dict[str, Any]:
    return answer(engine, CHAT, {"messages": REPEAT, "temperature": 0, "max_tokens": 12,
                                 **body})[0]


def next_logprobs(model: ChatModel, ids: list[int]) -> torch.Tensor:
    """By hand: the model's log-softmax after ``ids``, from one plain forward pass."""
    with torch.inference_mode():
        out = model.model(input_ids=torch.tensor([ids]))
    return torch.log_softmax(out.logits[0, -1].double(), -1)


def test_logit_bias_of_100_forces_a_token_and_minus_100_bans_it(engine: GenerationEngine,
                                                                smol: ChatModel) -> None:
    plain = chat(engine)["choices"][0]["message"]["content"]
    forced = smol.prompt_ids(" cat")[0]
    out = chat(engine, logit_bias={str(forced): 100}, max_tokens=5)
    assert out["choices"][0]["message"]["content"] == " cat" * 5
    first = smol.prompt_ids(plain)[0]
    banned = chat(engine, logit_bias={str(first): -100})["choices"][0]["message"]["content"]
    assert banned != plain and not banned.startswith(smol.decode([first]))


def test_presence_and_frequency_penalties_change_a_greedy_repetition(
        engine: GenerationEngine, smol: ChatModel) -> None:
    def greedy(prompt: str, **penalty: float) -> str:
        out, _ = answer(engine, COMPLETIONS, {"prompt": prompt, "max_tokens": 16,
                                              "temperature": 0, **penalty})
        return str(out["choices"][0]["text"])

    def distinct(text: str) -> int:
        return len(set(smol.prompt_ids(text)))

    yes = "yes yes yes yes yes yes yes yes yes yes"
    assert greedy(yes, presence_penalty=2.0) != greedy(yes)
    ones = "1, 1, 1, 1, 1, 1, 1, 1,"
    plain = greedy(ones)
    assert plain.split(",")[:4] == [" 1"] * 4 and distinct(plain) <= 3  # it repeats
    assert greedy(ones, presence_penalty=0.0) == plain  # 0 is no penalty
    penalized = greedy(ones, frequency_penalty=2.0)  # each repeat costs more
    assert penalized != plain and distinct(penalized) > distinct(plain) + 3


def test_chat_logprobs_are_the_models_and_the_greedy_token_is_the_most_likely(
        engine: GenerationEngine, smol: ChatModel) -> None:
    out = chat(engine, logprobs=True, top_logprobs=5, max_tokens=6)
    choice = out["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] == 6
    for t in content:
        assert len(t["top_logprobs"]) == 5
        assert t["logprob"] == max(x["logprob"] for x in t["top_logprobs"])
        assert t["top_logprobs"][0]["token"] == t["token"]
        assert bytes(t["bytes"]).decode() == t["token"]
    assert b"".join(bytes(t["bytes"]) for t in content).decode() == \
        choice["message"]["content"]
    # the first token's, by hand: log-softmax of the model's scores after the prompt
    prompt = smol.chat_ids(REPEAT)
    hand = next_logprobs(smol, prompt)
    first = smol.prompt_ids(content[0]["token"])[0]
    assert content[0]["logprob"] == pytest.approx(float(hand[first]), abs=1e-4)
    # without top_logprobs: the tokens alone
    bare = chat(engine, logprobs=True, max_tokens=3)["choices"][0]["logprobs"]["content"]
    assert [t["top_logprobs"] for t in bare] == [[], [], []]
    assert [t["token"] for t in bare] == [t["token"] for t in content[:3]]


def test_logprobs_follow_the_temperature_and_the_bias(engine: GenerationEngine,
                                                      smol: ChatModel) -> None:
    """The distribution the token was drawn from: penalties and bias applied, divided
    by the temperature (1 for greedy rows)."""
    greedy = chat(engine, logprobs=True, top_logprobs=2, max_tokens=1)
    t0 = greedy["choices"][0]["logprobs"]["content"][0]
    hot = chat(engine, logprobs=True, top_logprobs=2, max_tokens=1, temperature=0.5,
               seed=1)["choices"][0]["logprobs"]["content"][0]
    hand = next_logprobs(smol, smol.chat_ids(REPEAT))
    top = smol.prompt_ids(t0["token"])[0]
    assert t0["logprob"] == pytest.approx(float(hand[top]), abs=1e-4)
    sharp = torch.log_softmax(hand * 2, -1)  # log-softmax(logits / 0.5)
    assert hot["top_logprobs"][0]["logprob"] == pytest.approx(float(sharp[top]), abs=1e-4)
    biased = chat(engine, logprobs=True, max_tokens=1, logit_bias={str(top): -100})
    assert biased["choices"][0]["logprobs"]["content"][0]["token"] != t0["token"]


def test_n_choices_are_independent_seeded_sequences(engine: GenerationEngine) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 11}
    three, c = answer(engine, COMPLETIONS, {**body, "n": 3})
    texts = [ch["text"] for ch in three["choices"]]
    assert [ch["index"] for ch in three["choices"]] == [0, 1, 2] and len(set(texts)) == 3
    assert three["usage"]["prompt_tokens"] == 4  # the prompt once
    assert three["usage"]["completion_tokens"] == 24  # every choice's tokens
    again, _ = answer(engine, COMPLETIONS, {**body, "n": 3})
    assert [ch["text"] for ch in again["choices"]] == texts  # seeds make it repeatable
    one, _ = answer(engine, COMPLETIONS, body)
    assert one["choices"][0]["text"] == texts[0]  # choice i is seeded seed + i
    chats = chat(engine, n=2, temperature=1.0, seed=3, max_tokens=6)
    assert [ch["index"] for ch in chats["choices"]] == [0, 1]
    assert chats["usage"]["completion_tokens"] == 12


def test_echo_prepends_the_prompt_with_its_logprobs(engine: GenerationEngine,
                                                    smol: ChatModel) -> None:
    prompt = "The capital of France is"
    plain, _ = answer(engine, COMPLETIONS, {"prompt": prompt, "max_tokens": 4,
                                            "temperature": 0})
    echoed, _ = answer(engine, COMPLETIONS, {"prompt": prompt, "max_tokens": 4,
                                             "temperature": 0, "echo": True})
    assert echoed["choices"][0]["text"] == prompt + plain["choices"][0]["text"]
    lp, _ = answer(engine, COMPLETIONS, {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                         "echo": True, "logprobs": 2})
    got = lp["choices"][0]["logprobs"]
    ids = smol.prompt_ids(prompt)
    assert len(got["tokens"]) == len(ids) + 4
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    assert "".join(got["tokens"]) == lp["choices"][0]["text"]
    for i, tok in enumerate(got["tokens"]):  # every token starts where its text does
        assert lp["choices"][0]["text"][got["text_offset"][i]:].startswith(tok)
    for j in range(1, len(ids)):  # a prompt token's log probability, by hand
        hand = next_logprobs(smol, ids[:j])
        assert got["token_logprobs"][j] == pytest.approx(float(hand[ids[j]]), abs=1e-4)
        assert len(got["top_logprobs"][j]) >= 2
    # without echo the offsets still count from the prompt's start (as OpenAI's do)
    bare, _ = answer(engine, COMPLETIONS, {"prompt": prompt, "max_tokens": 4,
                                           "temperature": 0, "logprobs": 0})
    assert bare["choices"][0]["logprobs"]["text_offset"][0] == len(prompt)
    assert bare["choices"][0]["logprobs"]["top_logprobs"] is None  # logprobs 0: none


def test_best_of_returns_the_choice_of_highest_mean_logprob(engine: GenerationEngine) -> None:
    body = {"prompt": "My favourite food is", "max_tokens": 6, "temperature": 1.0,
            "seed": 5, "logprobs": 0}
    every, _ = answer(engine, COMPLETIONS, {**body, "n": 3})

    def mean(ch: dict[str, Any]) -> float:
        lps = ch["logprobs"]["token_logprobs"]
        return sum(lps) / len(lps)

    best = max(every["choices"], key=mean)
    one, _ = answer(engine, COMPLETIONS, {**body, "best_of": 3})
    assert [ch["text"] for ch in one["choices"]] == [best["text"]]
    assert one["usage"]["completion_tokens"] == every["usage"]["completion_tokens"]
    two, _ = answer(engine, COMPLETIONS, {**body, "best_of": 3, "n": 2})
    ranked = sorted(every["choices"], key=mean, reverse=True)[:2]
    assert [ch["text"] for ch in two["choices"]] == [ch["text"] for ch in ranked]
    assert [ch["index"] for ch in two["choices"]] == [0, 1]
    plain, _ = answer(engine, COMPLETIONS, {**body, "best_of": 3, "logprobs": None})
    assert plain["choices"][0]["logprobs"] is None  # ranked all the same
    assert plain["choices"][0]["text"] == best["text"]


def test_a_logit_bias_id_outside_the_vocabulary_is_refused(smol: ChatModel) -> None:
    with pytest.raises(InvalidRequest) as e:
        build_request(smol, CHAT, {"model": SMOL, "messages": REPEAT,
                                   "logit_bias": {"49152": 5}})
    assert e.value.param == "logit_bias" and "49152" in e.value.message
    build_request(smol, CHAT, {"model": SMOL, "messages": REPEAT, "logit_bias": {"49151": 5}})


def test_token_texts_are_their_bytes(smol: ChatModel) -> None:
    texts = TokenTexts(smol.tokenizer)
    ids = smol.prompt_ids("naïve café — 日本語 🙂")
    raw = b"".join(bytes(texts(t)[1]) for t in ids)
    assert raw.decode() == "naïve café — 日本語 🙂"
    torn = [t for t in ids if texts(t)[0].startswith("\\x") or "\\x" in texts(t)[0]]
    assert torn  # a character cut between tokens shows its bytes escaped
    assert texts.offsets(smol.prompt_ids("a bc d")) == [0, 1, 4]


# Streamed: the realtime lane's events and chunks ------------------------------------------

class FakePublisher:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def put(self, channel: str, data: bytes) -> None:
        self.events.append(orjson.loads(data))


def streamed(engine: GenerationEngine, endpoint: str, body: dict[str, Any]
             ) -> list[dict[str, Any]]:
    """The chunks an API writes of the lane's events (as api/routes/inference.py does with
    ``choices`` events): the role chunk, each event's chunk, the usage."""
    import threading

    from workers.lanes.realtime_sinks import MeteredSink

    body = {"model": SMOL, **body}
    pub = FakePublisher()
    msg = {"id": "rt-1", "kind": endpoint, "body": body}
    sink = MeteredSink(pub, msg, set(), None)  # type: ignore[arg-type]
    req = build_request(engine.model, endpoint, body)
    sink.shape(req)
    done = threading.Event()
    inner = sink.finish
    sink.finish = lambda r, u: (inner(r, u), done.set())  # type: ignore[method-assign]
    engine.submit(req, sink, 0)
    assert done.wait(300)
    w = ChunkWriter(SMOL, endpoint == CHAT)
    chunks = [c for c in [w.first()] if c is not None]
    for ev in pub.events:
        if ev["t"] == "delta":
            assert "choices" in ev and isinstance(ev["text"], str)
            chunks.append(w._chunk(ev["choices"]))
        elif ev["t"] == "done":
            assert ev["chunked"] is True
    for c in chunks:
        if endpoint == CHAT:
            ChatCompletionChunk.model_validate(c)
        else:  # a text_completion chunk before the last has no finish_reason yet (as
            # the stream's chunks always had): the SDK's type wants one, its client not
            sdk_strict(endpoint, {**c, "choices": [{**ch, "finish_reason": ch[
                "finish_reason"] or "length"} for ch in c["choices"]]})
    return chunks


def test_streamed_chunks_carry_their_choices_index_and_logprobs(
        engine: GenerationEngine) -> None:
    body = {"messages": REPEAT, "temperature": 0, "max_tokens": 6, "logprobs": True,
            "top_logprobs": 2, "n": 2}
    whole = chat(engine, **{k: v for k, v in body.items() if k != "messages"})
    chunks = streamed(engine, CHAT, {**body, "stream": True})
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        text = "".join(ch["delta"].get("content") or "" for ch in mine)
        tokens = [t for ch in mine if ch["logprobs"] for t in ch["logprobs"]["content"]]
        assert text == whole["choices"][i]["message"]["content"]
        want = whole["choices"][i]["logprobs"]["content"]
        # the same tokens; their numbers equal up to float noise (another batch's shapes)
        assert [t["token"] for t in tokens] == [t["token"] for t in want]
        assert [t["logprob"] for t in tokens] == pytest.approx([t["logprob"] for t in want],
                                                                abs=1e-4)
        assert [len(t["top_logprobs"]) for t in tokens] == [2] * len(want)
        assert mine[0]["delta"].get("role") == "assistant"
        assert [ch["finish_reason"] for ch in mine][-1] == "length"
    comp = streamed(engine, COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 5,
                                          "temperature": 0, "logprobs": 1, "echo": True,
                                          "stream": True})
    assert comp[0]["choices"][0]["text"] == "Once upon a time"  # the echo comes first
    lp = comp[0]["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["text_offset"][0] == 0


# Fanned-out requests fail and leave alone (the tiny model) --------------------------------

def test_a_fanned_request_that_fails_fails_alone(tiny: ChatModel) -> None:
    engine = GenerationEngine(tiny)
    try:
        ok, bad = Collect(), Collect()
        prompt = tiny.prompt_ids("a cat sat")
        engine.submit(GenRequest(prompt=prompt, max_new_tokens=6, temperature=0, n=2,
                                 best_of=2, logprobs=1), ok, 2)
        # a bias naming no token of the model (build_request refuses it; here it is
        # let through): each of its sequences fails to sample, its request fails once
        engine.submit(GenRequest(prompt=prompt, max_new_tokens=6, temperature=0, n=3,
                                 best_of=3, logit_bias={10**7: 1.0}), bad, 2)
        ok.result(timeout=120)
        with pytest.raises(Exception) as e:
            bad.result(timeout=120)
        assert "index" in str(e.value).lower() or "out of bounds" in str(e.value).lower()
        assert [len(c.tokens or []) for c in ok.choices] == [6, 6]
        assert ok.usage.completion_tokens == 12
    finally:
        engine.stop()


def test_a_cancelled_fanned_request_is_billed_once_for_all_it_generated(
        tiny: ChatModel) -> None:
    class Leaving(Collect):
        def __init__(self) -> None:
            super().__init__()
            self.abandons: list[Usage] = []

        def piece(self, index: int, text: str, tokens: Any) -> None:
            super().piece(index, text, tokens)
            if sum(len(c.parts) for c in self.choices) >= 4:
                self.cancel()

        def abandoned(self, u: Usage) -> None:
            self.abandons.append(u)
            self.event.set()

    engine = GenerationEngine(tiny, max_batch_rows=2, max_rows=2)  # a third waits
    try:
        sink = Leaving()
        engine.submit(GenRequest(prompt=tiny.prompt_ids("leave early"), max_new_tokens=60,
                                 temperature=0, n=3, best_of=3), sink, 2)
        assert sink.event.wait(120)
        engine.submit(GenRequest(prompt=[1, 2], max_new_tokens=2, temperature=0),
                      Collect(), 2)  # one more step: nothing is told twice
        assert len(sink.abandons) == 1
        u = sink.abandons[0]
        assert u.prompt_tokens == len(tiny.prompt_ids("leave early"))
        assert 0 < u.completion_tokens < 180 and not math.isnan(u.accelerator_s)
    finally:
        engine.stop()
