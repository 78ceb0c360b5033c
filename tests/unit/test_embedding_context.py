"""The embeddings model refuses inputs longer than its context instead of truncating them
(the packaged all-MiniLM-L6-v2: a 256-token window)."""

from __future__ import annotations

import pytest

from jobs.core.errors import InvalidRequest


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    from workers.models.embeddings import EmbeddingModel

    return EmbeddingModel("all-MiniLM-L6-v2")


def test_window_is_the_registered_context_length(model) -> None:  # type: ignore[no-untyped-def]
    assert model.max_length == 256  # the context_length publishing records for it


def test_text_over_the_context_is_refused(model) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest) as e:
        model.tokenize(["short", "word " * 300])
    assert (e.value.status, e.value.param, e.value.code) == (400, "input",
                                                             "context_length_exceeded")
    assert e.value.message.startswith("input[1] is 302 tokens long; all-MiniLM-L6-v2 takes "
                                      "at most 256 tokens")


def test_token_ids_over_the_context_are_refused(model) -> None:  # type: ignore[no-untyped-def]
    assert len(model.tokenize([[7] * 254])[0]) == 256  # with [CLS] and [SEP]: fits exactly
    with pytest.raises(InvalidRequest, match="^input is 257 tokens long"):
        model.tokenize([[7] * 255])


def test_inputs_that_fit_are_not_cut(model) -> None:  # type: ignore[no-untyped-def]
    (ids,) = model.tokenize(["word " * 254])
    assert len(ids) == 256
