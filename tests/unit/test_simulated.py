"""workers/models/simulated.py: the cost model's arithmetic, deterministic unit vectors,
the real model's request checks, and a simulated worker's modules without torch."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from jobs.core.errors import InvalidRequest, ModelNotLoaded
from jobs.core.settings import Settings
from jobs.fleet.builtin_models import BUILTIN
from jobs.protocol.embeddings import EmbeddingsBody
from workers.engines.batching import BatchPolicy
from workers.engines.embeddings import EmbeddingEngine, is_oom
from workers.engines.scheduling import BATCH
from workers.models import simulated
from workers.models.simulated import PROFILES, Profile, SimulatedEmbeddingModel, unit_vector

MODEL = "all-MiniLM-L6-v2"
H100 = PROFILES["h100-minilm"]


def minilm_dir() -> Path:
    b = BUILTIN[MODEL]
    assert b.package_dir is not None
    return b.package_dir()


class Sleeps(list[float]):
    """Records what the model would sleep (the clock is the process's edge)."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture(scope="module")
def sim() -> SimulatedEmbeddingModel:
    return simulated.from_directory(MODEL, minilm_dir(), 256, H100)


def test_cost_is_a_fixed_cost_per_pass_plus_a_cost_per_padded_token() -> None:
    p = Profile("t", "test", MODEL, embed_pass_ms=2.0, embed_token_us=0.5, chat_model="c",
                decode_step_ms=6.0, decode_row_us=20.0, prefill_token_us=0.4, source="test")
    assert p.embed_seconds(128, 32) == pytest.approx(0.002 + 128 * 32 * 0.5e-6)
    assert p.embed_seconds(1, 1) == pytest.approx(0.0020005)
    assert p.decode_seconds(32) == pytest.approx(0.006 + 32 * 20e-6)
    assert p.prefill_seconds(1000) == pytest.approx(1000 * 0.4e-6)


def test_every_profile_names_its_source_and_a_positive_cost() -> None:
    for name, p in PROFILES.items():
        assert p.name == name and p.source and p.embedding_model == MODEL
        assert p.embed_seconds(1, 1) > 0 and p.decode_seconds(1) > 0
    with pytest.raises(ValueError, match="h100-minilm"):
        simulated.profile("no-such-device")


def test_a_pass_sleeps_for_its_padded_tokens(sim: SimulatedEmbeddingModel) -> None:
    sleeps = Sleeps()
    m = SimulatedEmbeddingModel(MODEL, sim.tokenizer, 256, 384, 30522, H100, sleep=sleeps)
    out = m.embed([[101, 7, 102], [101, 1, 2, 3, 4, 102]])
    assert out.shape == (2, 384) and out.dtype == np.float32
    assert sleeps == [pytest.approx(H100.embed_seconds(2, 6))]


def test_vectors_are_unit_and_depend_on_the_token_ids_alone() -> None:
    a, b = unit_vector([101, 2023, 102], 384), unit_vector([101, 2023, 102], 384)
    other = unit_vector([101, 2024, 102], 384)
    assert a.shape == (384,) and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-6)
    assert np.array_equal(a, b)
    assert not np.allclose(a, other)
    # In a fresh process too: nothing depends on this process's state (hash seeds).
    code = ("from workers.models.simulated import unit_vector;"
            "print(repr(float(unit_vector([101, 2023, 102], 384)[7])))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, check=True)
    assert float(p.stdout) == float(a[7])


def test_the_engine_serves_the_simulated_model(sim: SimulatedEmbeddingModel) -> None:
    engine = EmbeddingEngine(sim, BatchPolicy(4096, 64))
    try:
        ids = sim.prepare(EmbeddingsBody(model=MODEL, input=["a cat", "a dog", "a cat"]))
        vecs = [f.result(10) for f in engine.submit(ids, BATCH)]
    finally:
        engine.stop()
    assert ids[0] == ids[2] and ids[0][0] == sim.tokenizer.cls_token_id
    assert np.array_equal(vecs[0], vecs[2]) and not np.allclose(vecs[0], vecs[1])
    assert np.array_equal(vecs[1], unit_vector(ids[1], 384))
    assert engine.stats.rows == 3 and engine.stats.batches >= 1


def test_requests_are_checked_as_the_real_model_checks_them(
        sim: SimulatedEmbeddingModel) -> None:
    assert (sim.dim, sim.vocab_size, sim.max_length) == (384, 30522, 256)
    with pytest.raises(ModelNotLoaded):
        sim.prepare(EmbeddingsBody(model="another-model", input="hi"))
    with pytest.raises(InvalidRequest, match="384"):
        sim.prepare(EmbeddingsBody(model=MODEL, input="hi", dimensions=385))
    with pytest.raises(InvalidRequest, match="vocabulary") as e:
        sim.prepare(EmbeddingsBody(model=MODEL, input=[[5, 30522]]))
    assert e.value.code == "invalid_token_id"
    with pytest.raises(InvalidRequest) as e:
        sim.prepare(EmbeddingsBody(model=MODEL, input="word " * 300))
    assert e.value.code == "context_length_exceeded"


def test_injected_faults_behave_as_the_real_model_s(sim: SimulatedEmbeddingModel) -> None:
    oom = SimulatedEmbeddingModel(MODEL, sim.tokenizer, 256, 384, 30522, H100,
                                  fault_oom_above_tokens=10, sleep=Sleeps())
    with pytest.raises(MemoryError) as e:
        oom.embed([[1] * 6, [1] * 6])
    assert is_oom(e.value)
    assert oom.embed([[1] * 5, [1] * 5]).shape == (2, 384)
    broken = SimulatedEmbeddingModel(MODEL, sim.tokenizer, 256, 384, 30522, H100,
                                     fault_fail=True, sleep=Sleeps())
    with pytest.raises(RuntimeError, match="injected"):
        broken.embed([[1]])


def test_settings_select_the_simulated_accelerator() -> None:
    st = Settings(accelerator="simulated", simulated_profile="cpu1-minilm")
    env = st.to_env()
    assert env["INFERQ_ACCELERATOR"] == "simulated"
    assert env["INFERQ_SIMULATED_PROFILE"] == "cpu1-minilm"
    assert Settings().accelerator == "auto"
    with pytest.raises(ValueError):
        Settings(accelerator="tpu")  # type: ignore[arg-type]


# What a simulated model worker's pool child imports and runs: the Celery app and its
# tasks, the runtime and the lanes, the simulated model in its engine, a shard chunk
# through the embeddings runner. torch must not be among the modules loaded.
NO_TORCH = """
import sys
import orjson
import workers.celery.app, workers.celery.tasks, workers.shards.pipeline
from workers.process import runtime as worker_runtime
from workers.engines.batching import BatchPolicy
from workers.engines.embeddings import EmbeddingEngine
from workers.engines.scheduling import BATCH
from workers.lanes.realtime import RealtimeConsumer
from workers.lanes.jobs import JobsConsumer
from workers.shards.runners import EmbeddingRunner
from workers.models import simulated
m = simulated.from_directory("all-MiniLM-L6-v2", __import__("pathlib").Path(sys.argv[1]), 256,
                             simulated.PROFILES["h100-minilm"])
engine = EmbeddingEngine(m, BatchPolicy(4096, 64))
held = __import__("types").SimpleNamespace(inputs=m, engine=engine)
runner = EmbeddingRunner(lambda name: held, 16)
rows = [{"custom_id": f"r{i}", "body": orjson.dumps({"model": "all-MiniLM-L6-v2",
                                                     "input": f"text {i}"})}
        for i in range(5)]
ok, err, n_ok, n_err, _ = runner.collect(runner.submit(rows, BATCH))
engine.stop()
heavy = sorted(x for x in ("torch", "sentence_transformers") if x in sys.modules)
print("ok", n_ok, "err", n_err, "loaded:", heavy)
"""


@pytest.fixture
def simulated_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("INFERQ_ACCELERATOR", "simulated")
    yield


def test_a_simulated_worker_never_imports_torch(simulated_env: None) -> None:
    p = subprocess.run([sys.executable, "-c", NO_TORCH, str(minilm_dir())],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok 5 err 0 loaded: []" in p.stdout
