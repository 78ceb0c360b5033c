"""A worker answers only for the models it holds, and refuses token ids its model has no
embedding for: on every lane the refusal is that request's own error (a 503
``model_not_loaded`` or a 400), never another model's answer or a failed micro-batch.
Uses the packaged all-MiniLM-L6-v2 (vocabulary of 30522 tokens)."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, ModelNotLoaded, NotFound
from jobs.core.schema import Model
from jobs.protocol.embeddings import EmbeddingsBody
from jobs.protocol.endpoints import CHAT
from workers.models.residency import Residency, Resident

MODEL = "all-MiniLM-L6-v2"


def body(**kw: Any) -> EmbeddingsBody:
    return EmbeddingsBody(**{"model": MODEL, "input": "x", **kw})


def row(custom_id: str, **kw: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "body": orjson.dumps({"model": MODEL, **kw})}


def test_token_ids_outside_the_vocabulary_are_refused(minilm) -> None:  # type: ignore[no-untyped-def]
    assert minilm.vocab_size == 30522
    assert len(minilm.prepare(body(input=[30521]))[0]) == 3  # the last id, with [CLS] [SEP]
    with pytest.raises(InvalidRequest) as e:
        minilm.prepare(body(input=[[7], [5, 99999]]))
    assert (e.value.status, e.value.param, e.value.code) == (400, "input", "invalid_token_id")
    assert e.value.message == ("input[1] holds token id 99999, but all-MiniLM-L6-v2's "
                               "vocabulary has 30522 tokens: ids must be below 30522")


def test_another_model_is_refused(minilm) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelNotLoaded) as e:
        minilm.prepare(body(model="bge-small"))
    assert (e.value.status, e.value.code, e.value.headers) == (
        503, "model_not_loaded", {"retry-after": "5"})
    assert e.value.message.startswith("no worker serves model 'bge-small' right now")


def test_batch_rows_refused_alone_the_rest_of_the_chunk_runs(minilm, minilm_engine) -> None:  # type: ignore[no-untyped-def]
    from workers.engines.scheduling import BATCH
    from workers.shards.runners import EmbeddingRunner

    residency = Residency(cast(Context, None), loader=refuse_loads)
    residency.hold(Resident(Model(name=MODEL, version="1", kind="embeddings", files=[]), 0,
                            inputs=minilm, engine=minilm_engine), "configured")
    runner = EmbeddingRunner(lambda name: residency.embedder(name, "1"), 100)
    rows = [row("a", input="hello"), row("b", input=[99999]),
            {"custom_id": "c", "body": orjson.dumps({"model": "bge-small", "input": "hi"})},
            row("d", input=[101, 7592])]
    ok, err, n_ok, n_err, tokens = runner.collect(runner.submit(rows, BATCH))
    assert (n_ok, n_err) == (2, 2)
    assert [orjson.loads(x)["custom_id"] for x in ok.splitlines()] == ["a", "d"]
    bad, other = (orjson.loads(x)["response"] for x in err.splitlines())
    assert bad["status_code"] == 400
    assert bad["body"]["error"]["code"] == "invalid_token_id"
    assert other["status_code"] == 503
    assert other["body"]["error"]["code"] == "model_not_loaded"
    assert "no worker serves model 'bge-small'" in other["body"]["error"]["message"]


def refuse_loads(m: Model) -> Resident:
    raise AssertionError(f"{m.name} must not be loaded")


def chat_residency(chat_model: str) -> tuple[Residency, Resident | None]:
    """A worker's residency holding ``chat_model`` (none for ""), whose engine is never
    built: a refusal must come before any load. It is given no database or store (a
    load would fail on them)."""
    residency = Residency(cast(Context, None), loader=refuse_loads)
    if not chat_model:
        return residency, None

    def never() -> Any:
        raise AssertionError("the chat model must not be loaded")

    res = Resident(Model(name=chat_model, version="1", kind="chat", files=[]), 0, chat=never)
    residency.hold(res, "configured")
    return residency, res


@pytest.mark.parametrize("held", ["", "SmolLM2-135M-Instruct"])
def test_chat_for_a_model_not_held_is_refused_without_loading(held: str) -> None:
    residency, res = chat_residency(held)
    for version in (None, "1"):
        with pytest.raises(ModelNotLoaded, match="^no worker serves model 'other-chat"):
            residency.chat("other-chat", version)
    if held:
        with pytest.raises(ModelNotLoaded, match=f"^no worker serves model '{held}'"):
            residency.chat(held, "2")  # another version of the name it holds
        assert res is not None and res.generation is None


def test_generation_batch_rows_for_a_model_not_held_get_error_lines() -> None:
    from workers.engines.scheduling import BATCH
    from workers.shards.runners import GenerationRunner

    residency, _ = chat_residency("")
    runner = GenerationRunner(lambda name: residency.chat(name, None), CHAT)
    rows = [{"custom_id": "g", "body": orjson.dumps(
        {"model": "other-chat", "messages": [{"role": "user", "content": "hi"}]})}]
    ok, err, n_ok, n_err, _ = runner.collect(runner.submit(rows, BATCH))
    assert (ok, n_ok, n_err) == (b"", 0, 1)
    resp = orjson.loads(err)["response"]
    assert resp["status_code"] == 503
    assert resp["body"]["error"]["code"] == "model_not_loaded"


def test_one_error_object_for_the_api_and_the_workers() -> None:
    from api.errors import error_body

    e = NotFound("No such file: f", param="file_id")
    assert error_body(e) == {"error": e.to_dict()} == {"error": {
        "message": "No such file: f", "type": "invalid_request_error", "param": "file_id",
        "code": "not_found"}}
