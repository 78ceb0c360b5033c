"""How every command finds the stack that ``inferq up`` runs on its data dir.

While it runs, ``inferq up`` holds a lock on ``<data dir>/up.lock`` (a second
``up`` on the same data dir is refused) and keeps ``<data dir>/stack.json``: the
resolved backend URLs, the API URL with its real port, and its pid. It removes
the file on exit; a file whose process is gone (a killed ``up``) is ignored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import click

from jobs.core.settings import Settings

STATE_FILE = "stack.json"
LOCK_FILE = "up.lock"


@dataclass(frozen=True)
class StackState:
    pid: int
    api_url: str  # the …/v1 base URL
    database_url: str
    redis_url: str
    object_store_url: str


def write(data_dir: Path, state: StackState) -> None:
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.chmod(0o600)  # the database URL may carry a password
    tmp.replace(path)


def read(data_dir: Path) -> StackState | None:
    """The running stack of this data dir, or None (none written, or its process is gone)."""
    try:
        state = StackState(**json.loads((data_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return state if alive(state.pid) else None


def remove(data_dir: Path, pid: int) -> None:
    state = read(data_dir)
    if state is None or state.pid == pid:
        (data_dir / STATE_FILE).unlink(missing_ok=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resolve(settings: Settings) -> Settings:
    """Settings with each backend URL left empty taken from the running stack of the
    data dir (URLs set explicitly win). Unchanged when no stack runs there."""
    state = read(settings.data_dir)
    if state is None:
        return settings
    found = {"database_url": state.database_url, "redis_url": state.redis_url,
             "object_store_url": state.object_store_url}
    return settings.model_copy(update={k: v for k, v in found.items()
                                       if not getattr(settings, k)})


class DataDirLock:
    """An exclusive lock on a data dir, held by one ``inferq up`` for its lifetime; the
    operating system releases it when the process ends, however it ends."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fh: IO[str] | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return False
        self._fh = fh
        return True

    def release(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


DATABASE, REDIS, OBJECT_STORE = "database_url", "redis_url", "object_store_url"


def backends(*needs: str) -> Settings:
    """Settings with the backend URLs of this data dir's running stack filled in; a
    one-line error when one of those the command ``needs`` is unknown."""
    st = resolve(Settings.from_env())
    missing = [f"INFERQ_{name.upper()}" for name in needs if not getattr(st, name)]
    if missing:
        raise click.ClickException(
            f"no inferq stack runs on data dir {st.data_dir}: start one with `inferq up` "
            "(or point INFERQ_DATA_DIR at the data dir of a running one), or set "
            + " and ".join(missing))
    return st
