"""Run the whole service on one machine: backends, migrations, API and workers.

Used by ``inferq up``, the demo, benchmarks and end-to-end tests. Empty backend
URLs mean embedded backends under ``data_dir``; the children get the resolved
URLs through their environment, so every process sees the same Settings.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

from jobs.dispatch import lane_queues
from jobs.settings import Settings
from storage.embedded import EmbeddedPostgres, EmbeddedRedis

if TYPE_CHECKING:
    from jobs.context import Context

ROOT = Path(__file__).resolve().parent.parent


def worker_command(lanes: str, name: str, loglevel: str = "INFO") -> list[str]:
    queues = lane_queues({x.strip() for x in lanes.split(",")})
    return [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker",
            "-Q", ",".join(queues), "-c", "1", "-P", "prefork", "-n", f"{name}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", loglevel]


def api_command(host: str, port: int, threads: int = 64) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-b", f"{host}:{port}", "-k", "gthread",
            "--threads", str(threads), "-w", "1", "--graceful-timeout", "10",
            "--access-logfile", "-", "--log-level", "warning", "api.wsgi:app"]


class Stack:
    def __init__(self, settings: Settings, port: int | None = None,
                 extra_env: dict[str, str] | None = None, log_dir: Path | None = None,
                 model_workers: int = 1) -> None:
        self.settings = settings
        self.port = port or settings.api_port
        self.extra_env = extra_env or {}
        self.log_dir = log_dir or settings.data_dir / "logs"
        self.model_workers = model_workers
        self.backends: list[Any] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api_key = ""

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.port}"

    def resolve_backends(self) -> Settings:
        """Start embedded backends for any URL left empty."""
        st, data = self.settings, self.settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        updates: dict[str, Any] = {}
        if not st.database_url:
            pg = EmbeddedPostgres(data / "pg")
            self.backends.append(pg)
            updates["database_url"] = pg.url
        if not st.redis_url:
            r = EmbeddedRedis(data / "redis")
            self.backends.append(r)
            updates["redis_url"] = r.url
        if not st.object_store_url:
            updates["object_store_url"] = f"file://{data / 'objects'}"
        self.settings = st.model_copy(update=updates)
        return self.settings

    def env(self, **extra: str) -> dict[str, str]:
        st = self.settings
        env = dict(os.environ)
        env.update({
            "INFERQ_DATABASE_URL": st.database_url, "INFERQ_REDIS_URL": st.redis_url,
            "INFERQ_OBJECT_STORE_URL": st.object_store_url, "INFERQ_DATA_DIR": str(st.data_dir),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        })
        env.update(self.extra_env)
        env.update(extra)
        return env

    def spawn(self, name: str, cmd: list[str], **env: str) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(cmd, env=self.env(**env), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start(self, api: bool = True, workers: bool = True) -> Stack:
        from jobs import service
        from jobs.context import Context
        from storage.db import migrate

        st = self.resolve_backends()
        migrate(st.database_url)
        ctx = Context(st)
        self.import_models(ctx)
        self.api_key = self.dev_key()
        service.ensure_key(ctx, "default", self.api_key)
        ctx.close()
        if workers:
            self.spawn("worker-control", worker_command("control", "control"),
                       INFERQ_LANES="control")
            for i in range(self.model_workers):
                self.start_model_worker(f"gpu{i}")
        if api:
            self.spawn("api", api_command(st.api_host, self.port))
            self.wait_healthy(need_workers=workers and self.model_workers > 0)
        return self

    def import_models(self, ctx: Context, timeout: float = 900) -> None:
        """Import the builtin models not registered yet, in a child process (importing
        needs torch; this launcher stays torch-free). Output: ``models-import.log``."""
        from jobs import registry

        missing = registry.missing_builtins(ctx)
        if not missing:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / "models-import.log"
        with path.open("ab") as log:
            p = subprocess.run([sys.executable, "-m", "cli.main", "models", "import", *missing],
                               env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, cwd=ROOT, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"importing models {', '.join(missing)} failed "
                               f"({p.returncode}); see {path}")

    def start_model_worker(self, name: str, lanes: str = "realtime,jobs,batch,flex",
                           **env: str) -> subprocess.Popen[bytes]:
        return self.spawn(f"worker-{name}", worker_command(lanes, name), INFERQ_LANES=lanes,
                          **env)

    def dev_key(self) -> str:
        path = self.settings.data_dir / "dev-api-key"
        if not path.exists():
            path.write_text("iq-dev-" + secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    def wait_healthy(self, timeout: float = 180, need_workers: bool = True) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}; see "
                                       f"{self.log_dir / (name + '.log')}")
            try:
                with urlopen(self.base_url + "/healthz", timeout=2):
                    return
            except HTTPError as e:
                last = e.read().decode()
                if not need_workers and '"database": "ok"' in last.replace('":"', '": "'):
                    return
            except (URLError, OSError) as e:
                last = str(e)
            time.sleep(0.3)
        raise TimeoutError(f"the stack did not become healthy: {last}")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        for b in reversed(self.backends):
            b.stop()
        self.backends.clear()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
