"""docker/compose.yaml brought up without a container daemon: this test reads the file
and runs every service built from this repository (its profile-less ones) as the
image would run it: the command from the service's ``entrypoint``/``command`` over the
Dockerfile's ``ENTRYPOINT``/``CMD``, the Dockerfile's ``ENV`` under the service's
``environment``, each in a home and data dir of its own (its own "host"), started in
``depends_on`` order by their conditions (a one-shot's success, a health check). The
backends are this machine's: the compose hosts ``postgres``, ``redis`` and ``minio`` map
to a new PostgreSQL database, a Redis DB of this test alone and the S3 server (moto)
over HTTP, where ``minio-init``'s bucket is made. A change to compose.yaml or a
Dockerfile is tested here; with the stack healthy, keys are made as docker/README.md
says, and a batch, a token stream, a job and a flex batch (on the spot worker) complete.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlsplit
from urllib.request import urlopen

import pytest
import yaml

from tests.conftest import free_port, fresh_database
from tests.helpers import emb_line, jsonl, lines, upload, wait

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BACKENDS = {"postgres", "redis", "minio", "minio-init"}  # this machine's, mapped
API_PORT = 8000  # the API image's (Dockerfile.api ENV) and the health check's


def dockerfile(path: Path) -> tuple[list[str], list[str], dict[str, str]]:
    """A Dockerfile's ENTRYPOINT, CMD (exec form) and ENV, of its last stage."""
    text = re.sub(r"\\\n", " ", path.read_text())
    entry: list[str] = []
    cmd: list[str] = []
    env: dict[str, str] = {}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "FROM":
            entry, cmd, env = [], [], {}
        elif word == "ENTRYPOINT":
            entry = json.loads(rest)
        elif word == "CMD":
            cmd = json.loads(rest)
        elif word == "ENV":
            env.update(tuple(kv.split("=", 1)) for kv in shlex.split(rest))  # type: ignore[misc]
    return entry, cmd, env


@dataclass
class Service:
    name: str
    spec: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    home: Path
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.home / "log"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.home, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def healthy(self) -> bool:
        """Its health check, as compose runs it (``CMD``: the argv in its environment)."""
        test = self.spec["healthcheck"]["test"]
        assert test[0] == "CMD", test
        port = self.env["INFERQ_API_PORT"]
        argv = [sys.executable if test[1] == "python" else test[1],
                *(a.replace(f"127.0.0.1:{API_PORT}/", f"127.0.0.1:{port}/") for a in test[2:])]
        return subprocess.run(argv, env=self.env, cwd=self.home, capture_output=True,
                              timeout=30).returncode == 0

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


def host_env(spec_env: dict[str, Any], image_env: dict[str, str], home: Path,
             backends: dict[str, str]) -> dict[str, str]:
    """A service's environment on a host of its own: nothing of this test's session, the
    image's ENV under the service's, a URL naming a compose backend host replaced by
    this machine's, and every listener on the loopback."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INFERQ_", "AWS_"))}
    env.update(image_env)
    env.update({k: str(v) for k, v in spec_env.items()})
    for k, v in list(env.items()):
        host = urlsplit(v).hostname if "://" in v else None
        if host in backends:
            env[k] = backends[host]
        elif v == "0.0.0.0":  # noqa: S104 - a listener's address, moved to the loopback
            env[k] = "127.0.0.1"
    env.update(HOME=str(home), INFERQ_DATA_DIR=str(home / "data"), HF_HUB_OFFLINE="1")
    return env


def command(spec: dict[str, Any], entry: list[str], cmd: list[str]) -> list[str]:
    """What the container runs: compose's entrypoint replaces the image's (and its CMD),
    compose's command replaces the CMD; ``inferq`` is this checkout's CLI."""
    if "entrypoint" in spec:
        entry, cmd = spec["entrypoint"], []
    argv = [*entry, *spec.get("command", cmd)]
    assert argv and argv[0] == "inferq", argv
    return [sys.executable, "-m", "cli.main", *argv[1:]]


@pytest.fixture
def compose(pg_admin_url: str, own_redis_url: str, s3_endpoint: str,
            tmp_path: Path) -> Iterator[dict[str, Service]]:
    import boto3

    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = {n: s for n, s in spec["services"].items() if not s.get("profiles")}
    init = " ".join(services["minio-init"]["command"])
    bucket = re.search(r"mc mb --ignore-existing local/([\w.-]+)", init)
    assert bucket, init
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket.group(1))
    with fresh_database(pg_admin_url) as db:
        backends = {"postgres": db, "redis": own_redis_url, "minio": s3_endpoint}
        ours: dict[str, Service] = {}
        for name, s in services.items():
            if name in BACKENDS:
                continue
            build = s["build"]
            entry, cmd, image_env = dockerfile(DOCKER / Path(build["dockerfile"]).name)
            home = tmp_path / name
            home.mkdir()
            env = host_env(s.get("environment", {}), image_env, home, backends)
            # one loopback for every "host": ports of their own
            env["INFERQ_API_PORT"] = str(free_port())
            if "INFERQ_WORKER_METRICS_PORT" in env:
                env["INFERQ_WORKER_METRICS_PORT"] = "0"
            ours[name] = Service(name, s, command(s, entry, cmd), env, home)
        try:
            yield ours
        finally:
            for svc in ours.values():
                if svc.proc is not None and svc.proc.poll() is None:
                    os.killpg(svc.proc.pid, signal.SIGTERM)
            for svc in ours.values():
                if svc.proc is not None:
                    try:
                        svc.proc.wait(60)
                    except subprocess.TimeoutExpired:
                        os.killpg(svc.proc.pid, signal.SIGKILL)
                        svc.proc.wait()


def bring_up(services: dict[str, Service], timeout: float = 600) -> float:
    """Start every service once what it depends on is as its condition asks; seconds
    until all are up and healthy."""
    t0 = time.monotonic()
    done: set[str] = set()  # completed one-shots, healthy or started services
    deadline = t0 + timeout
    while len(done) < len(services):
        for name, svc in services.items():
            if svc.proc is None:
                deps = svc.spec.get("depends_on", {})
                deps = dict.fromkeys(deps, {}) if isinstance(deps, list) else deps
                if all(d in BACKENDS or d in done for d in deps):
                    svc.start()
            elif name not in done:
                code = svc.proc.poll()
                if svc.spec.get("restart") in ("no", "on-failure", None) and "healthcheck" \
                        not in svc.spec and code is not None:
                    assert code == 0, f"{name} exited with {code}:\n{svc.tail()}"
                    done.add(name)
                elif code is not None:
                    pytest.fail(f"{name} exited with {code}:\n{svc.tail()}")
                elif "healthcheck" in svc.spec:
                    if svc.healthy():
                        done.add(name)
                elif name not in _one_shots(services):
                    done.add(name)  # started
        assert time.monotonic() < deadline, {n: s.tail() for n, s in services.items()
                                             if n not in done}
        time.sleep(0.5)
    return time.monotonic() - t0


def _one_shots(services: dict[str, Service]) -> set[str]:
    """Services others wait on to complete successfully."""
    out = set()
    for s in services.values():
        deps = s.spec.get("depends_on", {})
        if isinstance(deps, dict):
            out |= {d for d, c in deps.items()
                    if c.get("condition") == "service_completed_successfully"}
    return out


def inferq(svc: Service, *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "cli.main", *args], env=svc.env, cwd=svc.home,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@contextmanager
def said_by(services: dict[str, Service]) -> Iterator[None]:
    """A failure (an SDK error says nothing of the server's side) reported with where
    the test stood and each service's last log lines."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - reported in full below
        here = [f for f in traceback.extract_tb(e.__traceback__)
                if f.filename == __file__ and f.name != "said_by"]
        logs = "\n".join(f"--- {n} ---\n{s.tail()[-2500:]}" for n, s in services.items())
        pytest.fail(f"{type(e).__name__}: {e} at {here[-1].lineno if here else '?'}: "
                    f"{here[-1].line if here else ''}\n{logs}", pytrace=False)


def test_the_compose_stack_comes_up_and_serves(compose: dict[str, Service]) -> None:
    from openai import OpenAI

    assert {"migrate", "api", "worker-control", "worker", "worker-spot"} <= set(compose)
    t0 = time.monotonic()
    took = bring_up(compose)
    api = compose["api"]
    base = f"http://127.0.0.1:{api.env['INFERQ_API_PORT']}/v1"
    print(f"\ncompose-equivalent stack from nothing to healthy: {took:.1f} s")

    # docker/README.md's keys: an admin key from the API's host, a project, its key
    admin = inferq(api, "admin-key")
    project = inferq(api, "projects", "create", "compose", "--admin-key", admin,
                     "--api-url", base)
    key = inferq(api, "keys", "create", "--project", project, "--admin-key", admin,
                 "--api-url", base).splitlines()[-1]
    sdk = OpenAI(base_url=base, api_key=key, _strict_response_validation=True,
                 max_retries=0, timeout=300)
    with said_by(compose):
        # every lane has its live worker once readiness says so
        deadline = time.monotonic() + 300
        while True:
            try:
                with urlopen(f"{base[:-3]}/readyz?lane=realtime&lane=batch&lane=flex",
                             timeout=10):
                    break
            except HTTPError as e:
                ready = e.read().decode()
            assert time.monotonic() < deadline, ready
            time.sleep(1)
        print(f"every lane ready: {time.monotonic() - t0:.1f} s from nothing")

        batch = sdk.batches.create(input_file_id=upload(sdk, jsonl(
            [emb_line(i, f"compose row {i}") for i in range(20)])).id,
            endpoint="/v1/embeddings", completion_window="24h")
        flex = sdk.batches.create(input_file_id=upload(sdk, jsonl(
            [emb_line(i, f"flex row {i}") for i in range(20)])).id,
            endpoint="/v1/embeddings", completion_window="24h", extra_body={"service_tier": "flex"})
        stream = sdk.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=5, temperature=0, stream=True)
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces).strip(), pieces
        job: Any = sdk.post("/jobs", cast_to=object, body={"endpoint": "/v1/embeddings", "body": {
            "model": "all-MiniLM-L6-v2", "input": "a job"}})
        deadline = time.monotonic() + 120
        while job["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.3)
            job = sdk.get(f"/jobs/{job['id']}", cast_to=object)
        assert job["status"] == "completed", job
        for b in (batch, flex):
            done = wait(sdk, b.id, timeout=300)
            assert done.status == "completed" and done.request_counts.completed == 20, done
            assert len(lines(sdk, done.output_file_id)) == 20
        # the flex batch ran on the spot worker (`inferq worker --spot`: lane flex), the
        # other on the model worker (shards name their worker as its heartbeat does)
        from sqlalchemy import create_engine, text

        engine = create_engine(api.env["INFERQ_DATABASE_URL"])
        try:
            with engine.connect() as c:
                ran = {b: set(c.scalars(text("select worker from shards where batch_id = :b"),
                                        {"b": b})) for b in (batch.id, flex.id)}
        finally:
            engine.dispose()
        import redis

        from jobs.fleet.heartbeats import current as heartbeats

        r = redis.Redis.from_url(api.env["INFERQ_REDIS_URL"])
        try:
            lanes = {b["name"]: set(b["lanes"]) for b in heartbeats(r)}
        finally:
            r.close()
        assert all(lanes[w] == {"flex"} for w in ran[flex.id]), (ran, lanes)
        assert all("batch" in lanes[w] and "flex" not in lanes[w] for w in ran[batch.id]), (
            ran, lanes)
