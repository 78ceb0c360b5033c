"""The command lines of the service's processes: a Celery worker for some lanes and the
API under gunicorn (what ``inferq worker`` and ``inferq api`` run, and a stack starts)."""

from __future__ import annotations

import sys

from jobs.core.dispatch import lane_queues


def worker_command(lanes: str, name: str, loglevel: str = "INFO") -> list[str]:
    queues = lane_queues({x.strip() for x in lanes.split(",")})
    return [sys.executable, "-m", "celery", "-A", "workers.celery.app", "worker",
            "-Q", ",".join(queues), "-c", "1", "-P", "prefork", "-n", f"{name}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", loglevel]


def api_command(host: str, port: int, max_connections: int = 16_000,
                keepalive_s: int = 75) -> list[str]:
    """gunicorn serving the API: one process of api.server's gevent edge worker, which
    holds every connection as a greenlet. Its keep-alive outlasts the client's idle
    connections (gunicorn's default of 2 s is shorter than httpx's 5 s: a request sent
    on a connection the server is closing fails with "Server disconnected"). gunicorn
    parses with the edge's limits; the worker answers them in the OpenAI error shape."""
    from api.server import MAX_HEADER_FIELD, MAX_HEADERS, MAX_REQUEST_LINE

    return [sys.executable, "-m", "gunicorn", "-b", f"{host}:{port}",
            "-k", "api.server.EdgeWorker", "-w", "1",
            # the edge refuses past max_connections itself; the pool must not stop first
            "--worker-connections", str(max_connections + 64),
            "--backlog", "4096", "--graceful-timeout", "10", "--keep-alive", str(keepalive_s),
            "--limit-request-line", str(MAX_REQUEST_LINE),
            "--limit-request-field_size", str(MAX_HEADER_FIELD),
            "--limit-request-fields", str(MAX_HEADERS),
            "--access-logfile", "-", "--log-level", "warning", "api.wsgi:app"]
