"""Run the whole service on one machine: backends, migrations, API and workers.

Used by ``inferq up``, the demo, benchmarks and end-to-end tests. Empty backend
URLs mean embedded backends under ``data_dir``. The children get every setting,
backend URLs resolved, through their environment (``Settings.to_env``), so every
process sees the same Settings.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.forkserver
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

from cli.command_lines import api_command, worker_command
from cli.forked_child import ForkedChild, fork_server
from cli.lifeline import Lifeline
from cli.stop_signals import StopSignals
from cli.supervisor import Child
from jobs.core.lanes import CONTROL, MODEL_LANES
from jobs.core.settings import Settings
from jobs.tenants import auth
from storage.embedded import EmbeddedPostgres, EmbeddedRedis

if TYPE_CHECKING:
    from jobs.core.context import Context

READY_MARKERS = (b" ready: lanes=", b" ready.\n")  # in a worker's log
API = "api"  # the API child's name
ROOT = Path(__file__).resolve().parent.parent
DEV_KEY_FILE, ADMIN_KEY_FILE = "dev-api-key", "admin-api-key"
METRICS_TOKEN_FILE = "metrics-token"  # the API's /metrics, when no INFERQ_METRICS_TOKEN
LOCAL_WEBHOOK_HOSTS = "127.0.0.1"  # allowed webhook receivers of a stack that sets none


def _key_file(path: Path, prefix: str) -> str:
    """The key stored at ``path``; a new one (mode 0600, written atomically) if none."""
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(prefix + secrets.token_urlsafe(24))
        tmp.replace(path)
    return path.read_text().strip()


class StackError(RuntimeError):
    """The stack cannot start for a reason its user can fix (a port in use, a child
    that exited at start); the message says what to do."""


def port_free(host: str, port: int) -> bool:
    """Whether the API can listen on ``host:port`` now: the one check before anything
    starts. It binds as gunicorn does, with SO_REUSEADDR, so a port whose connections
    from a stopped server linger in TIME_WAIT is free, and one with a listener is not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Stack:
    def __init__(self, settings: Settings, port: int | None = None,
                 extra_env: dict[str, str] | None = None, log_dir: Path | None = None,
                 model_workers: int = 1, stop_signals: StopSignals | None = None,
                 metrics_port: int | None = None) -> None:
        if "webhook_allow_hosts" not in settings.model_fields_set:
            # A stack runs on one machine: its receivers (a developer's, the tests') may
            # listen on 127.0.0.1. A deployment names its own in INFERQ_WEBHOOK_ALLOW_HOSTS.
            settings = settings.model_copy(update={"webhook_allow_hosts": LOCAL_WEBHOOK_HOSTS})
        self.settings = settings
        self.port = port or settings.api_port
        self.extra_env = extra_env or {}
        self.log_dir = log_dir or settings.data_dir / "logs"
        self.model_workers = model_workers
        # The first of the workers' fixed metrics ports: the control worker's, then one
        # per model worker (worker_metrics_port_of); None: each process picks a free one.
        self.metrics_port = metrics_port
        self.backends: list[Any] = []
        self.procs: dict[str, Child] = {}
        # To start a child again: its command, environment, and whether it is forked.
        self.commands: dict[str, tuple[list[str], dict[str, str], bool]] = {}
        self.api_key = ""
        self.admin_key = ""
        self.stop_signals = stop_signals or StopSignals()  # not installed: never raises
        # Stops what this stack started should its process die without stopping it.
        self.lifeline: Lifeline | None = None
        self._fork_server_pid: int | None = None
        self._log_from: dict[str, int] = {}  # where each child's current run's log starts

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.port}"

    def resolve_backends(self) -> Settings:
        """Start embedded backends for any URL left empty."""
        st, data = self.settings, self.settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        updates: dict[str, Any] = {}
        if not st.database_url:
            with self.stop_signals.held():
                pg = EmbeddedPostgres(data / "pg")
                self.backends.append(pg)
                if pg.pid is not None:  # SIGINT: PostgreSQL's fast shutdown
                    self._outlive(pg.pid, signal.SIGINT, group=False)
            updates["database_url"] = pg.url
        if not st.redis_url:
            with self.stop_signals.held():
                r = EmbeddedRedis(data / "redis")
                self.backends.append(r)
                if r.proc is not None:
                    self._outlive(r.proc.pid, signal.SIGTERM, group=False)
            updates["redis_url"] = r.url
        if not st.object_store_url:
            updates["object_store_url"] = f"file://{data / 'objects'}"
        self.settings = st.model_copy(update=updates)
        return self.settings

    def env(self, **extra: str) -> dict[str, str]:
        """A child's environment: every setting (``extra_env`` and ``extra`` on top)."""
        env = dict(os.environ)
        env.update(self.settings.to_env())
        env.update({
            "INFERQ_API_PORT": str(self.port),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        })
        env.update(self.extra_env)
        env.update(extra)
        return env

    def spawn(self, name: str, cmd: list[str], forked: bool = False, **env: str) -> Child:
        """Start child ``name`` in a process group of its own, its output appended to
        its log (``log_path``); ``respawn`` starts it again the same way. ``forked``
        (a model worker's Celery command, when ``fork_workers`` is on and the
        accelerator is not the simulated one): forked from the fork server instead of a
        new interpreter, which skips importing torch. As with any multiprocessing
        program, a script that starts a stack needs an ``if __name__ == "__main__"``
        guard: a forked child imports the main module again."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(name)
        self._log_from[name] = log_path.stat().st_size if log_path.exists() else 0
        with self.stop_signals.held():
            proc: Child
            child_env = self.env(**env)
            # The simulated accelerator runs without torch: nothing to preload.
            if (forked and self.settings.fork_workers
                    and child_env.get("INFERQ_ACCELERATOR") != "simulated"):
                from workers.process import forked as forked_worker

                child = fork_server().Process(
                    target=forked_worker.run_celery, name=name,
                    args=(cmd, child_env, str(self.log_path(name)), str(ROOT)))
                child.start()
                proc = ForkedChild(child, cmd)
                server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid",
                                 None)
                if server is not None and server != self._fork_server_pid:
                    self._fork_server_pid = server
                    self._outlive(server, signal.SIGTERM, group=False)
            else:
                with self.log_path(name).open("ab") as log:
                    proc = subprocess.Popen(cmd, env=child_env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=ROOT, start_new_session=True)
            self.procs[name] = proc
            self.commands[name] = (cmd, env, forked)
            self._outlive(proc.pid, signal.SIGTERM, group=True)
        return proc

    def _stop_fork_server(self) -> None:
        """The fork server this stack started stops with it (multiprocessing would keep
        it until this process exits, and a stack may not be all the process does)."""
        server = multiprocessing.forkserver._forkserver
        if self._fork_server_pid is None or getattr(server, "_forkserver_pid",
                                                    None) != self._fork_server_pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._fork_server_pid, signal.SIGTERM)
        with contextlib.suppress(OSError):
            server._stop()  # type: ignore[attr-defined]  # reaps it; a new one starts on demand
        self._fork_server_pid = None

    def _outlive(self, pid: int, sig: int, group: bool) -> None:
        """Have the lifeline stop ``pid`` should this process die first (cli.lifeline)."""
        if self.lifeline is None:
            self.lifeline = Lifeline()
        self.lifeline.add(pid, sig, group)

    def respawn(self, name: str) -> Child:
        """Start child ``name`` again, as it was first started (``inferq up``'s
        supervisor calls it when the child exited)."""
        cmd, env, forked = self.commands[name]
        return self.spawn(name, cmd, forked, **env)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def ready(self, name: str) -> bool:
        """Whether child ``name``'s current run is ready: the API when its /healthz
        answers (gunicorn runs at log level warning, so its log never says "Listening
        at"); a worker when its log says so since this run started: a model worker's
        runtime ("worker … ready: lanes=…") or Celery ("celery@… ready.")."""
        if name == API:
            return self.api_answers()
        try:
            with self.log_path(name).open("rb") as f:
                f.seek(self._log_from.get(name, 0))
                logged = f.read()
        except OSError:
            return False
        return any(m in logged for m in READY_MARKERS)

    def api_answers(self, timeout: float = 1.0) -> bool:
        """Whether the API answers /healthz (liveness: it serves, whatever its backends
        and workers are doing) within ``timeout`` seconds."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.settings.api_host,
                                                        self.settings.api_host)
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        try:
            with urlopen(f"http://{host}:{self.port}/healthz", timeout=timeout) as r:
                return bool(r.status == 200)
        except (URLError, OSError, ValueError):
            return False

    def start(self, api: bool = True, workers: bool = True) -> Stack:
        from jobs.core.context import Context
        from storage.db import migrate

        if api and not port_free(self.settings.api_host, self.port):
            raise StackError(f"port {self.port} on {self.settings.api_host} is in use: pick "
                             "another with --port (or INFERQ_API_PORT)")
        if workers:
            self.check_metrics_ports()
        st = self.resolve_backends()
        migrate(st.database_url)
        ctx = Context(st)
        self.import_models(ctx)
        self.api_key = self.dev_key()
        auth.ensure_key(ctx, "default", self.api_key)
        self.admin_key = self.admin_api_key()
        auth.ensure_admin_key(ctx, self.admin_key)
        ctx.close()
        if not self.settings.metrics_token:  # every child, the API included, gets it
            self.settings = self.settings.model_copy(update={"metrics_token": _key_file(
                self.settings.data_dir / METRICS_TOKEN_FILE, "iq-metrics-")})
        if workers:
            self.spawn("worker-control", worker_command(CONTROL, CONTROL), False,
                       INFERQ_LANES=CONTROL, **self.worker_metrics_port_of(0))
            for i in range(self.model_workers):
                self.start_model_worker(f"gpu{i}", **self.worker_metrics_port_of(i + 1))
        if api:
            self.spawn(API, api_command(st.api_host, self.port, st.api_max_connections,
                                          st.api_keepalive_s))
            self.wait_healthy(need_workers=workers and self.model_workers > 0)
        return self

    def worker_metrics_port_of(self, slot: int) -> dict[str, str]:
        """The environment giving worker ``slot`` (0: the control worker, then each model
        worker) its fixed metrics port, which its restarts keep."""
        base = self.metrics_port
        return {} if base is None else {"INFERQ_WORKER_METRICS_PORT": str(base + slot)}

    def check_metrics_ports(self) -> None:
        """The fixed metrics ports are free now (as the API's port: the one check)."""
        host, n = self.settings.worker_metrics_host, self.model_workers + 1
        for port in ([] if self.metrics_port is None else range(self.metrics_port,
                                                                 self.metrics_port + n)):
            if not port_free(host, port):
                raise StackError(f"port {port} on {host} (a worker's metrics) is in use: "
                                 f"set INFERQ_WORKER_METRICS_PORT to the first of {n} free ports")

    def import_models(self, ctx: Context, timeout: float = 900) -> None:
        """Import the builtin models not registered yet, in a child process (importing
        needs torch; this launcher stays torch-free). Output: ``models-import.log``."""
        from jobs.fleet import builtin_models

        missing = builtin_models.missing_builtins(ctx)
        if missing:
            self.run_import(missing, timeout)

    def run_import(self, names: list[str], timeout: float) -> None:
        """``inferq models import NAMES`` as a child; a StackError when it fails or
        outlasts ``timeout`` seconds (then it is killed)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / "models-import.log"
        with path.open("ab") as log:
            with self.stop_signals.held():
                p = subprocess.Popen([sys.executable, "-m", "cli.main", "models", "import",
                                      *names], env=self.env(), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=ROOT, start_new_session=True)
                self._outlive(p.pid, signal.SIGTERM, group=True)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                raise StackError(f"importing models {', '.join(names)} did not finish in "
                                 f"{timeout:g} s; see {path}") from None
            except BaseException:  # a stop while it runs: it goes too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                p.wait()
                raise
        if p.returncode != 0:
            raise StackError(f"importing models {', '.join(names)} failed "
                             f"({p.returncode}); see {path}")

    def start_model_worker(self, name: str, lanes: str = ",".join(MODEL_LANES),
                           **env: str) -> Child:
        return self.spawn(f"worker-{name}", worker_command(lanes, name), True,
                          INFERQ_LANES=lanes, **env)

    def dev_key(self) -> str:
        """The project key of the data dir's ``default`` project (made once)."""
        return _key_file(self.settings.data_dir / DEV_KEY_FILE, "iq-dev-")

    def admin_api_key(self) -> str:
        """The admin key of the data dir (made once): the Admin API's, never a project's."""
        return _key_file(self.settings.data_dir / ADMIN_KEY_FILE, "iq-admin-")

    def wait_healthy(self, timeout: float = 180, need_workers: bool = True) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise StackError(f"{name} exited with {p.returncode} at start; see "
                                     f"{self.log_dir / (name + '.log')}")
            try:
                with urlopen(self.base_url + "/readyz", timeout=2) as r:
                    last = r.read().decode()
                if not need_workers or json.loads(last)["checks"]["workers"] > 0:
                    return
            except HTTPError as e:
                last = e.read().decode()
            except (URLError, OSError, ValueError, KeyError) as e:
                last = str(e)
            time.sleep(0.3)
        raise TimeoutError(f"the stack did not become healthy: {last}")

    def metrics_urls(self, timeout: float = 30) -> dict[str, str]:
        """Where each process serves Prometheus metrics: ``api`` (its /metrics) and every
        worker process, by the name and lanes its heartbeat announces. Waits up to
        ``timeout`` for the workers this stack started to announce theirs."""
        import orjson
        import redis

        from jobs.core.redis_keys import WORKERS

        urls = {"api": self.base_url + "/metrics"} if "api" in self.procs else {}
        expected = sum(name.startswith("worker-") for name in self.procs)
        r = redis.Redis.from_url(self.settings.redis_url)
        try:
            deadline = time.monotonic() + timeout
            while True:
                found = {}
                keys = list(r.scan_iter(match=WORKERS + "*", count=100))
                for raw in r.mget(keys) if keys else []:
                    info = orjson.loads(raw) if raw else {}
                    if info.get("metrics_url"):
                        label = f"worker {info['name']} ({','.join(info.get('lanes', []))})"
                        found[label] = info["metrics_url"]
                if len(found) >= expected or time.monotonic() > deadline:
                    return urls | dict(sorted(found.items()))
                time.sleep(0.3)
        finally:
            r.close()

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
        self._stop_fork_server()
        for b in reversed(self.backends):
            b.stop()
        self.backends.clear()
        if self.lifeline is not None:
            self.lifeline.done()
            self.lifeline = None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
