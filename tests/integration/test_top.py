"""``inferq top`` as a user runs it: a subprocess against a real API (the Flask app on
a threaded HTTP server, its own database and Redis DB), with a running batch whose
shards the test moves by hand. Once (``--once``: one frame on stdout), live under a
pseudo-terminal (the screen redraws as the batch moves; Ctrl-C exits 0), and its
failures: one line, exit status 1, never a traceback."""

from __future__ import annotations

import os
import pty
import re
import secrets
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from jobs.batches import queries as repo
from jobs.batches import service
from jobs.batches.outputs import Tokens
from jobs.core.context import Context
from jobs.core.schema import Batch, now
from jobs.core.settings import Settings
from jobs.fleet import catalog, heartbeats, registry
from jobs.slo import stats
from jobs.tenants import auth
from tests.conftest import free_port
from tests.helpers import CLI, as_key, submit_batch

MODEL = "all-MiniLM-L6-v2"
TOP = [*CLI, "top"]  # `inferq top`
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>78]")


@dataclass
class Api:
    url: str
    ctx: Context
    key: str
    admin_key: str
    batch_id: str
    shard_id: str
    data_dir: Path

    def env(self) -> dict[str, str]:
        """A user's environment: nothing of the test session's INFERQ_* settings, a data
        dir with no stack, a wide terminal."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
        env.update(INFERQ_DATA_DIR=str(self.data_dir), COLUMNS="200", LINES="60",
                   TERM="xterm-256color")
        return env

    def run(self, *args: str, columns: bool = True) -> subprocess.CompletedProcess[str]:
        env = self.env()
        if not columns:  # a pipe with no COLUMNS: what `inferq top --once | less` gets
            env.pop("COLUMNS")
        return subprocess.run([*TOP, *args], env=env, capture_output=True, text=True,
                              timeout=120)

    def commit_chunk(self, chunk: int, ok: int) -> None:
        with self.ctx.db.session() as s:
            assert repo.checkpoint(s, self.shard_id, "tok", 1, chunk, ok, ok, 0,
                                   Tokens(prompt=ok), 60)


@pytest.fixture
def api(own_settings: Settings, tmp_path: Path) -> Iterator[Api]:
    from api.app import create_app

    app = create_app(own_settings.model_copy(update={"shard_rows": 100, "chunk_rows": 50}))
    ctx: Context = app.extensions["inferq"]
    registry.register(ctx, MODEL, "1", "embeddings", "test",  # a registry row only
                      [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}], 256)
    catalog.invalidate(ctx)
    key = auth.create_tenant(ctx, f"top-{secrets.token_hex(3)}")[1]
    admin_key = f"iq-admin-{secrets.token_urlsafe(16)}"
    auth.ensure_admin_key(ctx, admin_key)
    batch_id = submit_batch(as_key(app, key), rows=250)
    service.validate_batch(ctx, batch_id)  # the test is the control worker
    with ctx.db.session() as s:
        b = s.get(Batch, batch_id)
        assert b is not None and b.status == "in_progress", b.errors
        b.in_progress_at = now() - 10
        shard_id = repo.shards_of(s, batch_id)[0].id
    with ctx.db.session() as s:
        assert repo.claim_shard(s, shard_id, "tok", "w-top", 60) is not None
    heartbeats.write(ctx.redis, "w-top@host", {
        "name": "w-top@host", "lanes": ["batch", "realtime"], "models": [MODEL],
        "breaker": "closed", "metrics_url": None, "at": time.time()}, 600)
    rec = stats.Recorder()
    rec.enabled = True
    for v in (0.02, 0.03, 0.04):
        rec.observe(stats.TTFT, "realtime", MODEL, v)
    assert rec.write(ctx.redis) == 3
    srv = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    a = Api(f"http://127.0.0.1:{srv.server_port}/v1", ctx, key, admin_key, batch_id, shard_id,
            tmp_path)
    a.commit_chunk(1, 50)
    yield a
    srv.shutdown()
    ctx.close()


def test_once_prints_one_frame(api: Api) -> None:
    p = api.run("--once", "--api-url", api.url, "--api-key", api.key, columns=False)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for title in ("Lanes", "Latency (p50 / p99)", "Workers", "Running batches"):
        assert title in out, out
    assert re.search(r"realtime\s+│\s+" + re.escape(MODEL) + r"\s+│\s+0\b", out), out
    assert re.search(r"batch\s+│\s+│\s+\d+", out), out  # the batch lane's Celery queue
    # 3 in the last 5 minutes; p50: rank 1.5 of 0.02 | 0.03, 0.04 in (0.025, 0.05]
    assert re.search(r"realtime\s+│\s+ttft\s+│\s+0\.01/s\s+│\s+31 ms", out), out
    assert "w-top@host" in out
    row = next(line for line in out.splitlines() if api.batch_id in line)
    assert "in_progress" in row and "50/250" in row, row
    # into a pipe, every column is there, not the first 80 characters' worth
    header = next(line for line in out.splitlines() if "BATCH" in line and "STATUS" in line)
    assert all(c in header for c in ("PROGRESS", "DONE", "RATE", "ETA")), header
    assert "project proj_" in out


def test_org_shows_every_project(api: Api) -> None:
    p = api.run("--once", "--org", "--api-url", api.url, "--admin-key", api.admin_key)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "every project (admin key)" in p.stdout and "PROJECT" in p.stdout
    assert api.batch_id in p.stdout


def screen_until(fd: int, pattern: str, seen: list[str], timeout: float = 60) -> str:
    """Read the terminal until ``pattern`` shows in the text (escape codes removed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen.append(os.read(fd, 65536).decode(errors="replace"))
            except OSError:  # the program exited: the terminal is closed
                break
        text = ANSI.sub("", "".join(seen))
        if re.search(pattern, text):
            return text
    raise AssertionError(f"{pattern!r} never showed; the screen read:\n"
                         + ANSI.sub("", "".join(seen))[-3000:])


def test_live_view_redraws_and_ctrl_c_exits_cleanly(api: Api) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: `inferq top` on the pseudo-terminal
        os.execve(TOP[0], [*TOP, "--interval", "0.3", "--api-url", api.url, "--api-key",
                           api.key], api.env())
    seen: list[str] = []
    status = None
    try:
        text = screen_until(fd, re.escape(api.batch_id) + r".*50/250", seen)
        assert "Lanes" in text and "QUEUED" in text and "w-top@host" in text
        api.commit_chunk(2, 50)  # the batch moves: the next frames say so
        screen_until(fd, re.escape(api.batch_id) + r".*100/250", seen)
        os.write(fd, b"\x03")  # Ctrl-C
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = code
                break
            select.select([fd], [], [], 0.2)
            try:
                seen.append(os.read(fd, 65536).decode(errors="replace"))
            except OSError:
                pass
        else:
            raise AssertionError("inferq top did not exit on Ctrl-C; the screen read:\n"
                                 + ANSI.sub("", "".join(seen))[-3000:])
    finally:
        if status is None:  # still running: a failed test leaves no process behind
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert "Traceback" not in "".join(seen) and "Aborted" not in "".join(seen)


def one_line_error(p: subprocess.CompletedProcess[str], *words: str) -> str:
    assert p.returncode == 1, p.stdout + p.stderr
    err = p.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def test_an_unreachable_api_is_one_line_and_exit_1(api: Api) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    one_line_error(api.run("--once", "--api-url", url, "--api-key", "iq-x"),
                   "cannot reach the inferq API", url)
    one_line_error(api.run("--api-url", url, "--api-key", "iq-x"),  # live: the same
                   "cannot reach the inferq API")


def test_a_refused_key_is_one_line_and_exit_1(api: Api) -> None:
    one_line_error(api.run("--once", "--api-url", api.url, "--api-key", "iq-wrong"),
                   "refused the API key")
    one_line_error(api.run("--once", "--org", "--api-url", api.url, "--admin-key", "iq-wrong"),
                   "refused the admin key", "--admin-key")
    one_line_error(api.run("--once", "--api-url", api.url), "no API key", "--api-key")
