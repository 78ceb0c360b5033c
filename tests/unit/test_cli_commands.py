"""The CLI's checks and error paths, without a stack: commands run in-process with
click's CliRunner, downloads against a small local HTTP server, the port check on
real sockets, the supervisor's signal handling on real signals."""

from __future__ import annotations

import errno
import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner, Result

from cli.errors import user_message
from cli.main import main
from cli.stack import Stack, StackError, port_free
from cli.stop_signals import Interrupted, StopSignals
from jobs.core.settings import Settings
from tests.conftest import free_port

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``inferq ARGS`` in-process, as a user with nothing configured and an empty data
    dir (no stack runs there)."""
    import os

    for k in [k for k in os.environ if k.startswith("INFERQ_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("INFERQ_DATA_DIR", str(tmp_path / "data"))

    def run(*args: str, **env: str) -> Result:
        return CliRunner().invoke(main, list(args), env=env)

    return run


def one_line(r: Result, *words: str, code: int = 1) -> str:
    assert r.exit_code == code, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# the port check ------------------------------------------------------------------


def test_a_port_left_in_time_wait_by_a_stopped_server_is_free() -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    assert not port_free("127.0.0.1", port)  # a listener: taken
    conn.close()  # the server closes first: its end of the connection stays in TIME_WAIT
    client.close()
    srv.close()
    assert port_free("127.0.0.1", port)  # gunicorn (SO_REUSEADDR) can listen there now


def test_a_stack_on_a_taken_port_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        st = Settings(data_dir=tmp_path, api_host="127.0.0.1")
        with pytest.raises(StackError, match=f"port {port} .* in use: pick another with --port"):
            Stack(st, port=port).start()
    assert not (tmp_path / "pg").exists() and not (tmp_path / "redis").exists()


# which backends each command needs -------------------------------------------------


@pytest.mark.parametrize(("args", "named", "not_named"), [
    (["admin-key"], ["INFERQ_DATABASE_URL"], ["INFERQ_REDIS_URL", "INFERQ_OBJECT_STORE_URL"]),
    (["models", "list"], ["INFERQ_DATABASE_URL"],
     ["INFERQ_REDIS_URL", "INFERQ_OBJECT_STORE_URL"]),
    (["migrate"], ["INFERQ_DATABASE_URL", "INFERQ_OBJECT_STORE_URL"], ["INFERQ_REDIS_URL"]),
])
def test_a_command_asks_only_for_the_backends_it_uses(run, args: list[str], named: list[str],  # type: ignore[no-untyped-def]
                                                      not_named: list[str]) -> None:
    err = one_line(run(*args), "no inferq stack runs on data dir", "inferq up", *named)
    assert not [x for x in not_named if x in err], err


@pytest.mark.parametrize("args", [["admin-key"], ["models", "list"]])
def test_a_database_url_is_enough_for_database_commands(run, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    nobody = f"postgresql+psycopg://inferq@127.0.0.1:{free_port()}/inferq"
    # past the check: the command goes to that database (where nothing listens)
    one_line(run(*args, INFERQ_DATABASE_URL=nobody), "cannot reach the database")


# the admin commands ----------------------------------------------------------------

ADMIN_COMMANDS = [["projects", "create", "team"], ["projects", "list"],
                  ["projects", "archive", "proj_x"], ["keys", "create", "--project", "proj_x"],
                  ["keys", "list", "--project", "proj_x"],
                  ["keys", "revoke", "--project", "proj_x", "key_x"],
                  ["limits", "set", "--project", "proj_x", "--model", MODEL, "--rpm", "5"],
                  ["limits", "list", "--project", "proj_x"], ["usage"]]


@pytest.mark.parametrize("args", ADMIN_COMMANDS, ids=" ".join)
def test_an_admin_command_needs_an_admin_key(run, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    one_line(run(*args), "no admin key", "--admin-key", "INFERQ_ADMIN_KEY", "inferq up")


@pytest.mark.parametrize("args", ADMIN_COMMANDS, ids=" ".join)
def test_an_admin_command_talks_to_the_api(run, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    one_line(run(*args, "--admin-key", "iq-admin-x", "--api-url", nowhere), "cannot reach",
             nowhere)
    # the key can come from the environment, the API URL too
    one_line(run(*args, INFERQ_ADMIN_KEY="iq-admin-x", INFERQ_API_URL=nowhere), "cannot reach")


@pytest.mark.parametrize("name", ["x" * 201, "a\x00b", "", "   ", "tab\there", "\udcff"])
def test_a_bad_project_name_is_a_usage_error(run, name: str) -> None:  # type: ignore[no-untyped-def]
    one_line(run("projects", "create", name), "NAME", "1 to 200 printable characters", code=2)
    one_line(run("keys", "create", "--project", "proj_x", "--name", name), "--name",
             "1 to 200 printable characters", code=2)


def test_a_project_name_of_200_characters_is_accepted(run) -> None:  # type: ignore[no-untyped-def]
    one_line(run("projects", "create", "é" * 200), "no admin key")  # past the name check


@pytest.mark.parametrize(("args", "words"), [
    (["limits", "set", "--project", "p", "--model", MODEL], ["at least one of", "--rpm"]),
    (["limits", "set", "--project", "p", "--model", MODEL, "--rpm", "x"], ["--rpm", "'x'"]),
    (["limits", "set", "--project", "p", "--model", MODEL, "--tpm", "-3"], ["--tpm"]),
    (["limits", "set", "--project", "p", "--model", MODEL, "--rpd", "1e9"], ["--rpd"]),
    (["usage", "--start", "yesterday"], ["--start", "24h"]),
    (["usage", "--bucket", "5m"], ["--bucket"]),
    (["usage", "--group-by", "user_id"], ["--group-by"]),
    (["projects", "create", "x", "--weight", "0"], ["--weight"]),
    (["keys", "revoke", "key_x"], ["--project"]),
])
def test_admin_arguments_are_checked_before_anything_is_sent(run, args: list[str],  # type: ignore[no-untyped-def]
                                                             words: list[str]) -> None:
    one_line(run(*args, "--admin-key", "iq-admin-x"), *words, code=2)


def test_times_and_limit_values() -> None:
    import time

    from cli.admin import LimitValue, parse_time

    assert parse_time("1700000000", "--start") == 1700000000
    assert parse_time("2024-01-02", "--start") == 1704153600
    assert parse_time("2024-01-02T01:00:00+01:00", "--start") == 1704153600
    assert abs(parse_time("2h", "--start") - (time.time() - 7200)) < 5
    lv = LimitValue()
    assert lv.convert("none", None, None) is None and lv.convert("12", None, None) == 12


# submit's arguments -------------------------------------------------------------------


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": MODEL, "input": "x"}}) + "\n")
    return path


def test_parquet_detection_comes_from_storage(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cli.batches import is_parquet_file

    pq.write_table(pa.table({"custom_id": ["a"], "input": ["x"]}), tmp_path / "in.data")
    (tmp_path / "in.jsonl").write_text("PAR")
    assert is_parquet_file(tmp_path / "in.data")
    assert not is_parquet_file(tmp_path / "in.jsonl")


def test_an_idempotency_key_too_long_for_the_upload_is_refused(run, jsonl: Path) -> None:  # type: ignore[no-untyped-def]
    from jobs.core.idempotency import MAX_KEY

    longest = MAX_KEY - len(":file")
    one_line(run("submit", str(jsonl), "--idempotency-key", "k" * (longest + 1)),
             "--idempotency-key", f"1 to {longest}", code=2)
    one_line(run("submit", str(jsonl), "--idempotency-key", "clé"), "ASCII", code=2)
    # the longest key passes the check; the command then looks for an API key
    one_line(run("submit", str(jsonl), "--idempotency-key", "k" * longest), "no API key")


# results: files written whole or not at all --------------------------------------------

PARQUET_BYTES = b"PAR1" + b"\0" * 100 + b"PAR1"
JSONL_BYTES = b'{"custom_id": "a"}\n' * 2000


class FakeApi(BaseHTTPRequestHandler):
    """The two routes ``inferq results`` reads. ``file-cut`` stops halfway."""

    batch = {"id": "batch_1", "object": "batch", "endpoint": "/v1/embeddings",
             "input_file_id": "file-in", "completion_window": "24h", "status": "completed",
             "created_at": 1, "output_file_id": "file-out", "error_file_id": "file-err",
             "request_counts": {"total": 2, "completed": 1, "failed": 1}}
    files = {"file-out": JSONL_BYTES, "file-err": JSONL_BYTES, "file-pq": PARQUET_BYTES}

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        if self.path.startswith("/v1/batches/"):
            body = json.dumps(self.batch).encode()
            self._send(body, len(body))
        elif self.path == "/v1/files/file-cut/content":
            self._send(JSONL_BYTES[:1000], len(JSONL_BYTES))  # then the connection closes
            self.close_connection = True
        else:
            body = self.files[self.path.split("/")[3]]
            self._send(body, len(body))

    def _send(self, body: bytes, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _client(api: str):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=api, api_key="k", max_retries=0)


def test_results_into_a_missing_directory_write_nothing(run, api: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, errors = tmp_path / "out.jsonl", tmp_path / "missing" / "errors.jsonl"
    err = one_line(run("results", "batch_1", "-o", str(out), "--errors", str(errors),
                       "--api-url", api, "--api-key", "k"))
    assert err == f"Error: {errors}: No such file or directory"
    assert not [p for p in tmp_path.iterdir() if p.name != "data"]  # no partial file

    under_a_file = tmp_path / "in.txt"
    under_a_file.write_text("x")
    one_line(run("results", "batch_1", "-o", str(under_a_file / "out.jsonl"),
                 "--api-url", api, "--api-key", "k"), str(under_a_file / "out.jsonl"),
             "Not a directory")


def test_results_are_written_whole(run, api: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    r = run("results", "batch_1", "-o", str(out), "--errors", str(errors), "--api-url", api,
            "--api-key", "k")
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == JSONL_BYTES and errors.read_bytes() == JSONL_BYTES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors.jsonl", "out.jsonl"]


def test_a_download_cut_short_leaves_no_file(api: str, tmp_path: Path) -> None:
    import click

    from cli.results import download_all

    client = _client(api)
    with pytest.raises(click.ClickException, match="download of file-cut broke off"):
        download_all(client, [("file-out", tmp_path / "a.jsonl"),
                              ("file-cut", tmp_path / "b.jsonl")])
    assert list(tmp_path.iterdir()) == []
    assert download_all(client, [("file-pq", tmp_path / "c.jsonl")]) == [tmp_path / "c.parquet"]
    assert (tmp_path / "c.parquet").read_bytes() == PARQUET_BYTES


# status --watch / submit --wait: the batch's event stream --------------------------------


def sse(ev_id: str, event: str, status: str, done: int, total: int = 10) -> bytes:
    data = {"object": "batch.progress", "batch_id": "batch_1", "status": status,
            "created_at": 1_700_000_000,
            "request_counts": {"total": total, "completed": done, "failed": 0},
            "usage": {"input_tokens": done, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": done}}
    return f"id: {ev_id}\nevent: {event}\ndata: {json.dumps(data)}\n\n".encode()


class EventsApi(BaseHTTPRequestHandler):
    """A batch's event stream that breaks off: each connection sends the next part of
    ``parts`` (chunked, then cut without the last chunk: a dropped connection; a part
    that ends with b"" ends with it: the stream's clean end) and the Last-Event-ID it
    was sent is recorded. ``GET /v1/batches/batch_1`` is the batch as it
    ended."""

    protocol_version = "HTTP/1.1"
    parts: list[list[bytes]] = []
    asked: list[str | None] = []
    batch = {**FakeApi.batch, "request_counts": {"total": 10, "completed": 10, "failed": 0}}

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        if not self.path.endswith("/events"):
            body = json.dumps(self.batch).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.asked.append(self.headers.get("Last-Event-ID"))
        part = self.parts.pop(0) if self.parts else None
        if part is None:  # nothing more: the batch ended and the client saw it
            self.send_response(204)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in [b"retry: 1000\n\n", b": keep-alive\n\n", *part]:
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.flush()
        self.close_connection = True  # no terminating chunk: the client sees a broken body

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def events_api() -> Iterator[tuple[str, type[EventsApi]]]:
    EventsApi.asked = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), EventsApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", EventsApi
    server.shutdown()
    server.server_close()


def test_watch_resumes_a_dropped_stream_from_its_last_event(run, events_api) -> None:  # type: ignore[no-untyped-def]
    api, handler = events_api
    handler.parts = [
        [sse("0-0", "status", "validating", 0), sse("1-0", "status", "in_progress", 0),
         sse("1-4", "progress", "in_progress", 4)],
        [],  # a connection that drops before any event
        [sse("1-7", "progress", "in_progress", 7), sse("3-10", "status", "finalizing", 10),
         sse("4-10", "status", "completed", 10)],
    ]
    r = run("status", "batch_1", "--watch", "--api-url", api, "--api-key", "k")
    assert r.exit_code == 0, r.output
    assert handler.asked == [None, "1-4", "1-4"]  # each reconnect from the last event seen
    changes = [x.split()[1] for x in r.output.splitlines() if " at " in x and "requests done" in x]
    assert changes == ["validating", "in_progress", "finalizing", "completed"]
    assert "batch_1: completed (10 completed, 0 failed)" in r.output  # then the usual status


def test_watch_of_an_ended_stream_stops(run, events_api) -> None:  # type: ignore[no-untyped-def]
    """A stream that ends (the API's time limit) is resumed; a 204 (ended, and seen) stops."""
    api, handler = events_api
    handler.parts = [[sse("0-0", "status", "validating", 0), b""]]
    r = run("status", "batch_1", "--watch", "--api-url", api, "--api-key", "k")
    assert r.exit_code == 0, r.output
    assert handler.asked == [None, "0-0"]
    assert "batch_1: completed (10 completed, 0 failed)" in r.output


def test_watch_errors_are_one_line(run, events_api, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Drops in a row past RECONNECTS end the command with one line saying how to resume;
    an unreadable event and an API that is not there are one line too."""
    import cli.event_stream

    api, handler = events_api
    monkeypatch.setattr(cli.event_stream, "RECONNECTS", 2)
    handler.parts = [[sse("0-0", "status", "validating", 0)], [], [], [], []]
    r = run("status", "batch_1", "--watch", "--api-url", api, "--api-key", "k")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert handler.asked == [None, "0-0", "0-0"]  # it dropped, then 2 reconnects dropped
    errors = [x for x in r.output.splitlines() if x.startswith("Error: ")]
    assert len(errors) == 1 and r.output.rstrip().endswith(errors[0]), r.output
    assert "lost the event stream of batch_1" in errors[0]
    assert "`inferq status batch_1 --watch`" in errors[0]
    # an event this client cannot read: one line too
    handler.parts = [[sse("0-0", "status", "validating", 0), b"data: {\"x\n\n"]]
    r = run("status", "batch_1", "--watch", "--api-url", api, "--api-key", "k")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    errors = [x for x in r.output.splitlines() if x.startswith("Error: ")]
    assert errors == [r.output.rstrip().splitlines()[-1]], r.output
    assert "unexpected event in the stream of batch_1" in errors[0]
    # an API that is not there at all: the usual line, at once
    unreachable = f"http://127.0.0.1:{free_port()}/v1"
    one_line(run("status", "batch_1", "--watch", "--api-url", unreachable, "--api-key", "k"),
             "cannot reach the inferq API", unreachable)


def test_a_404_outside_v1_says_the_api_url_ends_in_v1() -> None:
    def not_found(url: str) -> openai.NotFoundError:
        response = httpx.Response(404, request=httpx.Request("GET", url),
                                  json={"error": {"message": "Not Found", "type": "x"}})
        return openai.NotFoundError("Not Found", response=response,
                                    body={"message": "Not Found", "type": "x"})

    hinted = user_message(not_found("http://127.0.0.1:8000/batches/batch_1"))
    assert hinted == ("the API has no route /batches/batch_1 (HTTP 404): its routes are under "
                      "/v1; pass the …/v1 base URL as --api-url (INFERQ_API_URL)")
    assert user_message(not_found("http://127.0.0.1:8000/v1/batches/batch_1")) == \
        "Not Found (HTTP 404)"


# errors from this machine -------------------------------------------------------------


def test_local_errors_are_one_line() -> None:
    e = subprocess.TimeoutExpired([sys.executable, "-m", "cli.main", "models", "import"], 900)
    msg = user_message(e)
    assert msg is not None and "did not finish in 900 s" in msg and "\n" not in msg
    denied = PermissionError(errno.EACCES, "Permission denied", "/root/out.jsonl")
    assert user_message(denied) == "/root/out.jsonl: Permission denied"
    assert user_message(OSError(errno.EIO, "I/O error")) is None  # no file named: a bug


def test_a_model_import_that_runs_too_long_is_a_stack_error(tmp_path: Path) -> None:
    stack = Stack(Settings(data_dir=tmp_path), log_dir=tmp_path / "logs")
    with pytest.raises(StackError, match=r"did not finish in 0\.01 s; see .*models-import\.log"):
        stack.run_import([MODEL], timeout=0.01)


# inferq up's signals ------------------------------------------------------------------


@pytest.fixture
def signals() -> Iterator[StopSignals]:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    s = StopSignals()
    s.install()
    yield s
    signal.signal(signal.SIGTERM, before[0])
    signal.signal(signal.SIGINT, before[1])


def test_a_signal_while_starting_interrupts_the_start(signals: StopSignals) -> None:
    with pytest.raises(Interrupted) as caught:
        signal.raise_signal(signal.SIGTERM)
        for _ in range(1000):  # the handler runs between two bytecodes of this thread
            pass
    assert caught.value.signum == signal.SIGTERM and signals.received == signal.SIGTERM
    signal.raise_signal(signal.SIGINT)  # a second signal, e.g. during the cleanup: recorded
    assert signals.received == signal.SIGTERM


def test_a_process_being_started_is_started_whole(signals: StopSignals) -> None:
    started = []
    with pytest.raises(Interrupted), signals.held():
        signal.raise_signal(signal.SIGINT)
        started.append("redis")  # e.g. a backend recorded for Stack.stop
    assert started == ["redis"] and signals.received == signal.SIGINT


def test_once_up_a_signal_is_only_recorded(signals: StopSignals) -> None:
    signals.raising = False
    signal.raise_signal(signal.SIGTERM)
    assert signals.received == signal.SIGTERM


def test_a_progress_line_into_a_pipe_is_whole(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`submit --wait` piped into a log: the counts, rate and times on an 80-column line,
    none of them cut short for a bar."""
    from cli.client import batch_progress

    monkeypatch.delenv("COLUMNS", raising=False)
    with batch_progress(rate=True) as bar:
        task = bar.add_task("batch_066210a27c4a6f67f3aaa7669b completed", total=300,
                            rate="148.9 req/s")
        bar.update(task, completed=300)
    last = [x for x in capsys.readouterr().out.splitlines() if x.strip()][-1]
    assert "300/300" in last and "148.9 req/s" in last and "…" not in last, last
    assert len(last) <= 80, last
