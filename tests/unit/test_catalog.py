"""Request validation against a registry snapshot (jobs.fleet.catalog), without a database."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jobs.core.errors import InvalidRequest
from jobs.fleet import registry
from jobs.fleet.catalog import Catalog, ModelInfo
from jobs.protocol.batch import BatchCreate
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from jobs.protocol.parsing import parse_embeddings, parse_generation
from jobs.protocol.validation import parse_model

MODELS = Catalog([ModelInfo("emb-b", "embeddings"), ModelInfo("Emb-a", "embeddings"),
                  ModelInfo("talker", "chat")])


def test_a_registered_model_is_accepted() -> None:
    req = parse_embeddings({"model": "emb-b", "input": "hi"}, 8, MODELS)
    assert req.model == "emb-b"
    for endpoint, body in ((CHAT, {"messages": [{"role": "user", "content": "hi"}]}),
                           (COMPLETIONS, {"prompt": "hi"})):
        assert parse_generation(endpoint, {"model": "talker", **body}, MODELS).model == "talker"
    assert MODELS.require("Emb-a", EMBEDDINGS) == ModelInfo("Emb-a", "embeddings")


def test_unknown_model_lists_the_models_of_its_endpoint() -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_embeddings({"model": "gpt-x", "input": "hi"}, 8, MODELS)
    assert (e.value.param, e.value.code) == ("model", "model_not_found")
    assert e.value.message == ("The model 'gpt-x' does not exist. Models for /v1/embeddings: "
                               "Emb-a, emb-b")
    with pytest.raises(InvalidRequest) as e:
        parse_generation(CHAT, {"model": "emb-b", "messages": [{"role": "user",
                                                               "content": "x"}]}, MODELS)
    assert e.value.message == ("The model 'emb-b' is an embeddings model, not for "
                               "/v1/chat/completions. Models for /v1/chat/completions: talker")


def test_no_model_of_a_kind_says_so() -> None:
    with pytest.raises(InvalidRequest, match="none is registered"):
        Catalog([]).require("x", COMPLETIONS)


def test_workers_rereading_a_checked_body_skip_the_model_check() -> None:
    assert parse_embeddings({"model": "gone-since", "input": "hi"}, 8).model == "gone-since"


@pytest.mark.parametrize(("body", "message"), [
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata: at most 16 key-value pairs"),
    ({"metadata": {"k" * 65: "v"}}, "metadata: keys are at most 64 characters"),
    ({"endpoint": "/v1/nope"}, "endpoint must be one of /v1/embeddings, "
                               "/v1/chat/completions, /v1/completions, /v1/responses"),
    ({"completion_window": "1h"}, "completion_window: Input should be '24h'"),
])
def test_messages_name_their_param_once(body: dict[str, object], message: str) -> None:
    base = {"input_file_id": "file-1", "endpoint": EMBEDDINGS, "completion_window": "24h"}
    with pytest.raises(InvalidRequest) as e:
        parse_model(BatchCreate, {**base, **body})
    assert e.value.message == message


def test_a_model_name_is_quoted_escaped_and_cut_short() -> None:
    with pytest.raises(InvalidRequest) as e:
        MODELS.require("bad\x00" + "m" * 10_000, EMBEDDINGS)
    assert e.value.message.startswith("The model 'bad\\x00mmm")
    assert "\x00" not in e.value.message and len(e.value.message) < 200


def test_the_registry_does_not_import_the_catalog() -> None:
    # jobs.fleet.catalog reads jobs.fleet.registry; the registry tells it of a registration by a
    # counter it reads (registry.generation), not by importing it back, even late
    tree = ast.parse(Path(registry.__file__).read_text())
    names = [f"{n.module}.{a.name}" if isinstance(n, ast.ImportFrom) else a.name
             for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
             for a in n.names]
    assert names and not [x for x in names if "catalog" in x]


def test_a_completions_model_serves_completions_only() -> None:
    models = Catalog([ModelInfo("talker", "chat"), ModelInfo("writer", "completions")])
    body = {"model": "writer", "prompt": "Once"}
    assert parse_generation(COMPLETIONS, body, models).model == "writer"
    with pytest.raises(InvalidRequest) as e:
        parse_generation(CHAT, {"model": "writer",
                                "messages": [{"role": "user", "content": "hi"}]}, models)
    assert (e.value.param, e.value.code) == ("model", "model_not_found")
    assert e.value.message == ("The model 'writer' is a completions model, not for "
                               "/v1/chat/completions. Models for /v1/chat/completions: talker")
    with pytest.raises(InvalidRequest) as e:
        parse_generation(COMPLETIONS, {"model": "nope", "prompt": "x"}, models)
    assert e.value.message.endswith("Models for /v1/completions: talker, writer")
