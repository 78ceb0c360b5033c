"""``dimensions`` is checked in two places, each with what it knows: the door (API,
batch and job validation) refuses what no model could serve, and any value for a model
whose registry entry is not trained for shortened vectors; the worker, which
holds the model, refuses more dimensions than the model produces, with the same 400
on every lane (``EmbeddingModel.prepare``)."""

from __future__ import annotations

import pytest

from jobs.core.errors import InvalidRequest
from jobs.fleet.catalog import Catalog, ModelInfo
from jobs.protocol.parsing import parse_embeddings
from workers.models.embeddings import check_dimensions

MODEL = "all-MiniLM-L6-v2"  # 384-dimensional


@pytest.mark.parametrize("dims", [0, -3, 2**63, "many", 1.5])
def test_the_door_refuses_what_no_model_serves(dims: object) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_embeddings({"model": MODEL, "input": "x", "dimensions": dims}, 10)
    assert (e.value.status, e.value.param) == (400, "dimensions")


def test_only_a_model_trained_for_shortened_vectors_takes_them() -> None:
    models = Catalog([ModelInfo(MODEL, "embeddings"),
                      ModelInfo("nested", "embeddings", matryoshka=True)])
    with pytest.raises(InvalidRequest) as e:
        parse_embeddings({"model": MODEL, "input": "x", "dimensions": 8}, 10, models)
    assert (e.value.status, e.value.param, e.value.code) == (400, "dimensions",
                                                             "unsupported_parameter")
    assert e.value.message == ("dimensions: unsupported parameter: the model "
                               "'all-MiniLM-L6-v2' was not trained for shortened vectors (its "
                               "registry entry is not matryoshka); leave dimensions out for "
                               "its full vectors")
    assert parse_embeddings({"model": MODEL, "input": "x"}, 10, models).dimensions is None
    assert parse_embeddings({"model": "nested", "input": "x", "dimensions": 8}, 10,
                            models).dimensions == 8


def test_the_door_leaves_the_upper_bound_to_the_model() -> None:
    assert parse_embeddings({"model": MODEL, "input": "x", "dimensions": 1000}, 10
                            ).dimensions == 1000


@pytest.mark.parametrize("dims", [None, 1, 64, 384])
def test_up_to_the_models_size_is_served(dims: int | None) -> None:
    check_dimensions(dims, MODEL, 384)


def test_more_than_the_model_produces_is_refused() -> None:
    with pytest.raises(InvalidRequest) as e:
        check_dimensions(385, MODEL, 384)
    err = e.value
    assert (err.status, err.type, err.param) == (400, "invalid_request_error", "dimensions")
    assert err.message == ("dimensions is 385, but all-MiniLM-L6-v2 produces 384-dimensional "
                           "embeddings: ask for at most 384")


def test_every_lane_checks_through_the_model() -> None:
    from workers.models.embeddings import EmbeddingModel

    model = EmbeddingModel(MODEL)
    assert model.dim == 384
    ok = parse_embeddings({"model": MODEL, "input": ["a b", "c"], "dimensions": 384}, 10)
    assert [len(ids) for ids in model.prepare(ok)] == [4, 3]  # with [CLS] and [SEP]
    too_many = parse_embeddings({"model": MODEL, "input": "a", "dimensions": 1000}, 10)
    with pytest.raises(InvalidRequest, match="^dimensions is 1000, but all-MiniLM-L6-v2 "):
        model.prepare(too_many)
