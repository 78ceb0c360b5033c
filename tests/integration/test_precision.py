"""Precision per model version: derived versions in the registry (real PostgreSQL), what
/v1/models and `inferq models` say, and the loaders applying it to real weights."""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.fleet import registry

FILES = [{"path": "model.safetensors", "bytes": 10, "sha256": "0" * 64}]


def fresh_name() -> str:
    return f"precision-test-{secrets.token_hex(4)}"


def base(ctx: Context, name: str, version: str = "1") -> None:
    registry.register(ctx, name, version, "embeddings", "test", FILES, 128)


def test_a_derived_version_shares_the_files_and_is_not_the_default(ctx: Context) -> None:
    name = fresh_name()
    base(ctx, name)
    m = registry.derive(ctx, name, "1", "1-int8", "int8")
    src = registry.get(ctx, name, "1")
    assert src is not None and m.precision == "int8" and src.precision == "fp32"
    assert m.object_prefix == src.object_prefix and m.files == src.files
    assert not m.is_default
    default = registry.get_default(ctx, name)
    assert default is not None and default.version == "1"  # newer, but not fp32
    assert registry.set_default(ctx, name, "1-int8").is_default
    default = registry.get_default(ctx, name)
    assert default is not None and default.version == "1-int8"
    base(ctx, name, "2")  # a new full-precision version takes over, as every new one does
    default = registry.get_default(ctx, name)
    assert default is not None and default.version == "2"
    registry.derive(ctx, name, "2", "2-int8", "int8", make_default=True)
    default = registry.get_default(ctx, name)
    assert default is not None and default.version == "2-int8" and default.precision == "int8"


@pytest.mark.parametrize(("args", "message"), [
    (("9", "9-int8", "int8"), "has no version '9'"),
    (("1", "1", "int8"), "a version name of its own"),
    (("1", "1-x", "int4"), "invalid precision 'int4'"),
])
def test_derive_refuses(ctx: Context, args: tuple[str, str, str], message: str) -> None:
    name = fresh_name()
    base(ctx, name)
    with pytest.raises(ValueError, match=message):
        registry.derive(ctx, name, *args)


def test_models_endpoint_reports_the_precision(ctx: Context, client: Any) -> None:
    name = fresh_name()
    base(ctx, name)
    registry.derive(ctx, name, "1", "1-int8", "int8", make_default=True)
    body = client.get(f"/v1/models/{name}").get_json()
    assert body["precision"] == "int8" and body["version"] == "1-int8"


def cli(settings: Settings, *args: str) -> Any:
    from cli.main import main

    env = {"INFERQ_DATABASE_URL": settings.database_url, "INFERQ_DATA_DIR": "/nonexistent"}
    return CliRunner().invoke(main, list(args), env=env)


def test_cli_derive_default_and_list(ctx: Context, settings: Settings) -> None:
    name = fresh_name()
    base(ctx, name)
    res = cli(settings, "models", "derive", name, "--from", "1", "--version", "1-int8",
              "--precision", "int8")
    assert res.exit_code == 0, res.output
    assert f"{name}: version 1-int8 registered (int8, the files of 1)" in res.output
    res = cli(settings, "models", "default", name, "1-int8")
    assert res.exit_code == 0 and "1-int8 (int8) is the default" in res.output, res.output
    listing = cli(settings, "models", "list")
    line = next(x for x in listing.output.splitlines() if name in x and "1-int8" in x)
    assert line.startswith("*") and " int8 " in line
    for bad, code, text in (
            (["derive", name, "--from", "7", "--version", "7b", "--precision", "int8"], 1,
             "has no version '7'"),
            (["derive", name, "--from", "1", "--version", "x", "--precision", "int4"], 2,
             "Invalid value for '--precision'"),
            (["default", name, "nope"], 1, "has no version 'nope'")):
        res = cli(settings, "models", *bad)
        assert res.exit_code == code and text in res.output, res.output
        assert "Traceback" not in res.output


def test_int8_embeddings_stay_close_to_fp32(minilm: Any) -> None:
    import torch

    from workers.models.embeddings import EmbeddingModel

    q = EmbeddingModel("all-MiniLM-L6-v2", precision="int8")
    assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in q.model.modules())
    texts = ["a queue of batch inference requests", "the cat sat on the mat",
             "PostgreSQL keeps the job state", "tokens stream over server-sent events"]
    ids = minilm.tokenize(texts)
    ref, got = minilm.embed(ids), q.embed(ids)
    assert got.dtype == np.float32 and got.shape == ref.shape
    cos = (ref * got).sum(axis=1)
    assert cos.min() > 0.96, cos
    # Still an embedding of its own text: each is nearest to its fp32 counterpart.
    assert ((got @ ref.T).argmax(axis=1) == np.arange(len(texts))).all()


def test_half_precision_is_for_gpus_and_int8_for_cpus(tiny: Any) -> None:
    import copy

    import torch

    from workers.models import precision

    cpu = torch.device("cpu")
    for p in ("bf16", "fp16"):
        with pytest.raises(precision.PrecisionUnavailable, match="served by GPU workers"):
            precision.apply(copy.deepcopy(tiny.model), p, cpu)
    with pytest.raises(precision.PrecisionUnavailable, match="served by CPU workers"):
        precision.check("int8", torch.device("cuda"))
    q = precision.apply(copy.deepcopy(tiny.model), "int8", cpu)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        ref, got = tiny.model(input_ids=ids).logits, q(input_ids=ids).logits
    assert got.shape == ref.shape and torch.isfinite(got).all()
    assert precision.apply(tiny.model, "fp32", cpu) is tiny.model
