"""The CLI's plumbing without a stack: settings handed to children, the state file of
``inferq up``, its data-dir lock, and how results and errors are shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli import state
from cli.batches import grouped_errors, parse_metadata
from cli.command_lines import api_command
from cli.results import fitting_name
from cli.stack import Stack
from jobs.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_to_env_round_trips_every_setting(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    st = Settings(data_dir=tmp_path, spot=True, chat_model="", lease_seconds=3.5,
                  database_url="postgresql+psycopg://u@h/db", api_port=9123)
    env = st.to_env()
    assert set(env) == {f"INFERQ_{name.upper()}" for name in Settings.model_fields}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert Settings.from_env() == st


def test_stack_children_get_every_setting(tmp_path: Path) -> None:
    st = Settings(data_dir=tmp_path, shard_rows=40, janitor_interval_s=1.0)
    env = Stack(st, port=9555).env()
    assert env["INFERQ_SHARD_ROWS"] == "40" and env["INFERQ_JANITOR_INTERVAL_S"] == "1.0"
    assert env["INFERQ_API_PORT"] == "9555"
    assert Stack(st, extra_env={"INFERQ_SHARD_ROWS": "7"}).env()["INFERQ_SHARD_ROWS"] == "7"


def test_api_keeps_connections_longer_than_clients() -> None:
    cmd = api_command("127.0.0.1", 8000, keepalive_s=Settings().api_keepalive_s)
    assert int(cmd[cmd.index("--keep-alive") + 1]) > 5  # httpx keeps idle connections 5 s


def test_every_setting_is_in_the_configuration_doc() -> None:
    doc = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    listed = set(re.findall(r"`(INFERQ_[A-Z_0-9]+)`", doc))
    assert {f"INFERQ_{n.upper()}" for n in Settings.model_fields} - listed == set()
    assert {"INFERQ_API_URL", "INFERQ_API_KEY"} <= listed


def test_state_is_found_and_fills_only_empty_urls(tmp_path: Path) -> None:
    s = state.StackState(pid=os.getpid(), api_url="http://127.0.0.1:9/v1",
                         database_url="postgresql+psycopg://a", redis_url="unix:///r.sock",
                         object_store_url="file:///o")
    state.write(tmp_path, s)
    assert state.read(tmp_path) == s
    got = state.resolve(Settings(data_dir=tmp_path, redis_url="redis://explicit/0"))
    assert (got.database_url, got.redis_url, got.object_store_url) == \
        ("postgresql+psycopg://a", "redis://explicit/0", "file:///o")
    state.remove(tmp_path, os.getpid())
    assert state.read(tmp_path) is None


def test_state_of_a_dead_process_is_ignored(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    state.write(tmp_path, state.StackState(int(p.stdout), "u", "d", "r", "o"))
    assert state.read(tmp_path) is None
    assert state.resolve(Settings(data_dir=tmp_path)).embedded


def test_one_lock_per_data_dir(tmp_path: Path) -> None:
    first, second = state.DataDirLock(tmp_path), state.DataDirLock(tmp_path)
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


def test_errors_are_grouped_by_code_and_message() -> None:
    same = [SimpleNamespace(code="model_not_found", message="no model x", line=i)
            for i in range(1, 101)]
    other = SimpleNamespace(code="invalid_json_line", message="bad JSON", line=7)
    b = SimpleNamespace(errors=SimpleNamespace(data=[*same, other]))
    assert grouped_errors(b) == ["model_not_found: no model x (100 lines, 1–100)",
                                 "invalid_json_line: bad JSON (line 7)"]
    assert grouped_errors(SimpleNamespace(errors=None)) == []


@pytest.mark.parametrize(("name", "parquet", "written"), [
    ("out.jsonl", True, "out.parquet"), ("out.JSONL", True, "out.parquet"),
    ("out", True, "out.parquet"), ("out.parquet", True, "out.parquet"),
    ("out.parquet", False, "out.jsonl"), ("out", False, "out.jsonl"),
    ("out.jsonl", False, "out.jsonl"), ("out.txt", False, "out.txt"),
])
def test_results_are_named_after_their_content(name: str, parquet: bool,
                                               written: str) -> None:
    assert fitting_name(Path("/d") / name, parquet) == Path("/d") / written


def test_metadata_pairs() -> None:
    assert parse_metadata(["a=b", "c=d=e", "empty="]) == {"a": "b", "c": "d=e", "empty": ""}
    assert parse_metadata([]) is None
    with pytest.raises(Exception, match="KEY=VALUE"):
        parse_metadata(["novalue"])
