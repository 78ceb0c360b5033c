"""Fixtures for tests that start, kill and restart their own worker processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.core.context import Context
from tests.conftest import AWS_ENV, RedisDatabases, free_port, fresh_database

CHUNK = 40


@pytest.fixture(scope="session")
def fdatabase_url(pg_admin_url: str) -> Iterator[str]:
    with fresh_database(pg_admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def fredis_url(redis_dbs: RedisDatabases) -> Iterator[str]:
    with redis_dbs.lend() as url:
        yield url


@pytest.fixture(scope="session")
def fstack(settings, fdatabase_url, fredis_url, s3_endpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    """API + control worker on a database and Redis DB of their own (another stack's
    janitor must not hand these shards to its workers); model workers started per test."""
    from cli.stack import Stack

    st = settings.model_copy(update={"database_url": fdatabase_url,
                                     "redis_url": fredis_url, "chunk_rows": CHUNK,
                                     "shard_rows": 400, "lease_seconds": 3.0,
                                     "janitor_interval_s": 1.0, "stranded_shard_s": 5.0,
                                     "spot_notice_s": 20.0})
    # The stack registers the chat model, but its workers serve one only when a test
    # starts them with INFERQ_CHAT_MODEL.
    env = {**AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint, "INFERQ_CHAT_MODEL": ""}
    stack = Stack(st, port=free_port(), extra_env=env, log_dir=tmp_path_factory.mktemp("flogs"),
                  model_workers=0)
    stack.start(api=True, workers=True)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def fctx(fstack) -> Iterator[Context]:  # type: ignore[no-untyped-def]
    c = Context(fstack.settings)
    yield c
    c.close()


@pytest.fixture
def fsdk(fstack):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=fstack.base_url + "/v1", api_key=fstack.api_key,
                  _strict_response_validation=True, max_retries=0, timeout=120)


@pytest.fixture
def workers(fstack) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    started: list[str] = []

    def start(name: str, lanes: str = "batch", **env: str) -> Any:
        started.append(f"worker-{name}")
        return fstack.start_model_worker(name, lanes, **env)

    yield start
    for name in started:
        p = fstack.procs.pop(name, None)
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()




@pytest.fixture(scope="session")
def fvllm_tiny(fstack, fctx, tmp_path_factory) -> str:  # type: ignore[no-untyped-def]
    """A tiny random Llama (SmolLM2's tokenizer and chat template) added to ``fstack`` with
    engine vllm: the failure cases of the vLLM engine, at a tiny model's cost. Its name."""
    import shutil

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from jobs.fleet import own_models, registry
    from workers.models.cache import tokenizer_dir

    name = "tiny-llama-vllm"
    if registry.get_default(fctx, name) is not None:
        return name
    smol = registry.get_default(fctx, "SmolLM2-135M-Instruct")  # the stack imported it
    assert smol is not None
    path = tmp_path_factory.mktemp("tiny-vllm") / "model"
    shutil.copytree(tokenizer_dir(fctx, smol), path,
                    ignore=shutil.ignore_patterns("config.json", ".*"))
    tok = AutoTokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)).save_pretrained(str(path))
    own_models.add(fctx, name, str(path), "chat", engine="vllm")
    return name
