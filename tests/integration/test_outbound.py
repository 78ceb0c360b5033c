"""storage/outbound.py against real receivers on 127.0.0.1 (allowed explicitly):
redirects are results, timeouts hold, a huge body is not read, concurrent senders do
not wait on each other, and loopback names stay refused without the allow-list."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from storage.outbound import OutboundRefused, OutboundResult, post

LOCAL = frozenset({"127.0.0.1"})
TEN_MB = 10 * 1024 * 1024


class Server:
    """A TCP server on 127.0.0.1 whose connections ``handle(conn, request, server)``
    answers once the whole request arrived; it records each request and whatever the
    handler notes."""

    def __init__(self, handle: Callable[[socket.socket, bytes, Server], None]) -> None:
        self.requests: list[bytes] = []
        self.notes: list[Any] = []
        self.release = threading.Event()  # set at close: hanging handlers return
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                conn.settimeout(30)
                data = b""
                while b"\r\n\r\n" not in data:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    data += piece
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    rest += conn.recv(65536)
                request = head + b"\r\n\r\n" + rest
                outer.requests.append(request)
                handle(conn, request, outer)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(handle: Callable[[socket.socket, bytes, Server], None]) -> Server:
        servers.append(Server(handle))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def answer(status: str, body: bytes = b"", headers: str = "") -> Callable[..., None]:
    def handle(conn: socket.socket, _request: bytes, _server: Server) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{headers}"
                     "Connection: close\r\n\r\n".encode() + body)
    return handle


def send(url: str, allow: frozenset[str] = LOCAL, **kw: Any) -> OutboundResult:
    args: dict[str, Any] = {"connect_timeout": 2.0, "read_timeout": 5.0, "max_body": 4096}
    args.update(kw)
    return post(url, b'{"type": "batch.completed"}', {"Content-Type": "application/json",
                                                     "webhook-id": "msg_1"},
                allow_hosts=allow, **args)


def test_a_delivery_arrives_with_its_body_and_headers(serve: Callable[..., Server]) -> None:
    s = serve(answer("202 Accepted", b"thanks"))
    res = send(s.url + "?tenant=1")
    assert (res.status, res.body, res.error) == (202, b"thanks", None)
    head, _, body = s.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /hook?tenant=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{s.port}" in lines and "webhook-id: msg_1" in lines
    assert body == b'{"type": "batch.completed"}'


@pytest.mark.parametrize("status", ["301 Moved Permanently", "302 Found", "303 See Other",
                                    "307 Temporary Redirect", "308 Permanent Redirect"])
def test_a_redirect_to_a_private_address_is_a_result_never_followed(
        serve: Callable[..., Server], status: str) -> None:
    inside = serve(answer("200 OK", b"metadata"))  # a private address (loopback)
    for location in (inside.url, "http://169.254.169.254/latest/meta-data/",
                     "http://10.0.0.1/admin"):
        s = serve(answer(status, headers=f"Location: {location}\r\n"))
        res = send(s.url)
        assert (res.status, res.body, res.error) == (int(status[:3]), b"", None)
        assert len(s.requests) == 1
    assert inside.requests == []


def test_a_receiver_that_never_answers_is_cut_off_by_the_read_timeout(
        serve: Callable[..., Server]) -> None:
    s = serve(lambda _c, _r, srv: srv.notes.append(srv.release.wait(60)))
    started = time.monotonic()
    res = send(s.url, read_timeout=0.5)
    waited = time.monotonic() - started
    assert res.status is None and res.error is not None and res.error.startswith("timed out")
    assert len(s.requests) == 1  # it got the request and held the connection
    assert waited < 30  # not the 60 s the receiver would hold it (bound, not a benchmark)


def test_a_receiver_that_drips_its_answer_is_cut_off_as_a_whole(
        serve: Callable[..., Server]) -> None:
    """Every byte arrives well within the read timeout, the answer as a whole does not:
    the read timeout bounds the response, not each read."""
    def drip(conn: socket.socket, _request: bytes, srv: Server) -> None:
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                conn.sendall(bytes([byte]))
                if srv.release.wait(0.1):
                    return
            srv.notes.append("finished")
        except OSError:
            srv.notes.append("cut off")

    s = serve(drip)
    res = send(s.url, read_timeout=1.0)
    assert res.status is None and res.error is not None and res.error.startswith("timed out")
    deadline = time.monotonic() + 10
    while not s.notes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.notes == ["cut off"]


def test_a_ten_megabyte_answer_is_read_only_up_to_max_body(
        serve: Callable[..., Server]) -> None:
    def huge(conn: socket.socket, _request: bytes, srv: Server) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sent = 0
        try:
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {TEN_MB}\r\n\r\n".encode())
            block = bytes(range(256)) * 256  # 64 KiB
            while sent < TEN_MB:
                conn.sendall(block)
                sent += len(block)
            srv.notes.append(("all sent", sent))
        except OSError:
            srv.notes.append(("reset", sent))

    s = serve(huge)
    res = send(s.url, max_body=1000)
    assert (res.status, res.error) == (200, None)
    assert res.body == (bytes(range(256)) * 4)[:1000]
    deadline = time.monotonic() + 10
    while not s.notes and time.monotonic() < deadline:
        time.sleep(0.05)
    (outcome, sent), = s.notes
    assert outcome == "reset" and sent < TEN_MB // 2  # the sender closed, having read little


def test_endless_response_headers_are_cut_off(serve: Callable[..., Server]) -> None:
    def flood(conn: socket.socket, _request: bytes, srv: Server) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sent = 0
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while sent < TEN_MB:
                conn.sendall(b"X-Flood: " + b"a" * 1000 + b"\r\n")
                sent += 1011
            srv.notes.append(("all sent", sent))
        except OSError:
            srv.notes.append(("reset", sent))

    s = serve(flood)
    res = send(s.url)
    assert res.status is None and res.error is not None and res.error.startswith("failed")
    deadline = time.monotonic() + 10
    while not s.notes and time.monotonic() < deadline:
        time.sleep(0.05)
    (outcome, sent), = s.notes
    assert outcome == "reset" and sent < TEN_MB // 2


def test_network_failures_are_results_not_exceptions(serve: Callable[..., Server]) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    res = send(f"http://127.0.0.1:{closed_port}/hook")
    assert res.status is None and res.error is not None and "refused" in res.error.lower()

    def hang_up(conn: socket.socket, _request: bytes, _srv: Server) -> None:
        conn.close()
    res = send(serve(hang_up).url)
    assert res.status is None and res.error is not None and res.error.startswith("failed")

    res = send(serve(lambda c, _r, _s: c.sendall(b"not http at all\r\n\r\n")).url)
    assert res.status is None and res.error is not None


def test_ipv6_loopback_only_when_allowed(serve: Callable[..., Server]) -> None:
    class V6(socketserver.ThreadingTCPServer):
        address_family = socket.AF_INET6

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(65536)
            self.request.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    try:
        server = V6(("::1", 0), Handler)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://[::1]:{server.server_address[1]}/hook"
        with pytest.raises(OutboundRefused, match="loopback"):
            send(url, LOCAL)
        assert send(url, frozenset({"::1"})).status == 204
    finally:
        server.shutdown()
        server.server_close()


def test_loopback_names_stay_refused_without_the_allow_list(
        serve: Callable[..., Server]) -> None:
    s = serve(answer("200 OK"))
    for url in (s.url, f"http://localhost:{s.port}/hook", f"http://127.1:{s.port}/hook",
                f"http://[::ffff:127.0.0.1]:{s.port}/hook", f"http://0.0.0.0:{s.port}/hook"):
        with pytest.raises(OutboundRefused, match="only public addresses"):
            send(url, frozenset())
    with pytest.raises(OutboundRefused, match="only http:// and https://"):
        send(f"ftp://127.0.0.1:{s.port}/hook")
    assert s.requests == []


def test_a_slow_receiver_does_not_hold_up_concurrent_senders(
        serve: Callable[..., Server]) -> None:
    """Senders in threads share nothing: while one waits on a receiver that does not
    answer, forty deliveries to another all arrive, each with its own body."""
    slow = serve(lambda _c, _r, srv: srv.release.wait(60))

    def echo(conn: socket.socket, request: bytes, _srv: Server) -> None:
        body = request.partition(b"\r\n\r\n")[2]
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    fast = serve(echo)
    with ThreadPoolExecutor(8) as pool:
        stuck = pool.submit(send, slow.url, read_timeout=20)
        results = list(pool.map(
            lambda i: post(fast.url, b"delivery-%d" % i, {}, allow_hosts=LOCAL,
                           connect_timeout=2, read_timeout=5, max_body=100), range(40)))
        assert not stuck.done()  # the slow one is still waiting: nobody waited on it
        slow.release.set()
    assert [r.body for r in results] == [b"delivery-%d" % i for i in range(40)]
    assert all(r.status == 200 for r in results)
    assert stuck.result().status is None
