"""The API's HTTP edge: gunicorn's gevent worker, made to face many clients.

One API process runs one event loop, and every connection is a greenlet: idle
keep-alive connections, batch event followers and token streams cost memory, not
threads, so one process holds tens of thousands of them (``bench/edge.py``). On top
of gunicorn's gevent worker, :class:`EdgeWorker` keeps one client from taking the
edge for everyone:

- connection caps, in all and per client address (503 and 429);
- time limits: the request line and headers must arrive within
  ``api_header_timeout_s`` of their first byte, an idle keep-alive connection closes
  after ``api_keepalive_s``, and a body read that waits ``api_body_timeout_s`` for
  more bytes ends the request (408);
- bodies bounded before they are read: a chunk whose size line takes the body past
  the request's limit is a 413 at once (the bytes it announces are never waited
  for), and ``Expect: 100-continue`` is answered ``100 Continue`` only when the app
  first reads the body, so a request refused before that (an over-limit
  Content-Length: 413; a bad key: 401) gets its final answer without the 100;
- a transfer coding other than ``chunked`` (``gzip, chunked`` included: the body
  would reach the app still compressed) is a 501;
- every protocol-level refusal (a malformed request line, header or chunk, a header
  over the limit, a timeout) in the OpenAI error shape, never gunicorn's HTML, and
  logged as the client's (a warning line, no traceback); only a failure of this
  code is logged as an error.

On SIGTERM the requests in flight have gunicorn's graceful timeout to finish, and the
connections waiting for a request close at once: an idle keep-alive connection would
otherwise hold the stop for the whole timeout.

Its settings come from ``INFERQ_*`` like everything else (``jobs.core.settings``).
"""

from __future__ import annotations

import errno
import resource
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import gevent
import orjson
from gevent.socket import wait_read
from gunicorn import http
from gunicorn.http import errors as perr
from gunicorn.http import wsgi
from gunicorn.http.body import ChunkedReader
from gunicorn.workers.ggevent import GeventWorker
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge, RequestTimeout

from jobs.core.settings import Settings

# Request line and header limits: gunicorn enforces them while parsing, this module
# answers them (cli.command_lines.api_command passes them on).
MAX_REQUEST_LINE = 8190
MAX_HEADER_FIELD = 8190
MAX_HEADERS = 100
# Set by GuardedInput when a body read failed: the connection cannot serve another
# request, since where the next one starts is unknown.
CLOSE = "inferq.close_connection"
# Set while the client waits for ``100 Continue``: the callable that sends it, called
# by GuardedInput on the app's first read of the body.
CONTINUE = "inferq.continue"
CONTINUE_LINE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Transfer codings gunicorn passes through undecoded (the app would get the coded bytes).
CODINGS = ("gzip", "x-gzip", "deflate", "compress", "x-compress")
_DRAIN_S = 2.0  # an unread body left behind is drained for at most this long
_DRAIN_BYTES = 1024 * 1024  # ... and this many bytes; past either the connection closes
_HEAD_BYTES = MAX_REQUEST_LINE + MAX_HEADERS * (MAX_HEADER_FIELD + 2) + 4
_TRICKLE_S = 0.05  # a head still incomplete this long after its first byte trickles ...
_TRICKLE_POLL_S = 2.0  # ... and is read this often
_REASONS = {400: "Bad Request", 408: "Request Timeout", 414: "URI Too Long",
            417: "Expectation Failed", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable"}


class HeaderTimeout(Exception):
    """The request line and headers did not arrive within the header timeout."""


class UnsupportedCoding(Exception):
    """A transfer coding this edge does not decode."""


class ChunkTooLarge(perr.ParseException):
    """A chunk size line that takes the body past the request's limit."""


class BoundedChunks(ChunkedReader):
    """gunicorn's chunked body reader that refuses a chunk taking the body past
    ``limit`` bytes as soon as its size line is read (``ChunkTooLarge``), instead of
    waiting for the bytes it announces. ``limit`` is set by GuardedInput from the
    request's ``max_content_length`` before the first read (None: unbounded)."""

    limit: int | None = None
    announced = 0

    def parse_chunk_size(self, unreader: Any, data: Any = None) -> tuple[int, Any]:
        size, rest = super().parse_chunk_size(unreader, data)
        self.announced += size
        if self.limit is not None and self.announced > self.limit:
            raise ChunkTooLarge(f"a chunk of {size} bytes takes the request body past its "
                                f"limit of {self.limit} bytes")
        return size, rest


def check_codings(req: Any) -> None:
    """UnsupportedCoding for a Transfer-Encoding that codes the body beyond chunking."""
    for name, value in req.headers:
        if name == "TRANSFER-ENCODING":
            codings = [v.strip(" \t").lower() for v in value.split(",")]
            bad = [c for c in codings if c in CODINGS]
            if bad:
                raise UnsupportedCoding(f"unsupported transfer coding: {bad[0]} (only "
                                        "chunked is served; send the body uncompressed)")


def refusal(exc: BaseException) -> tuple[int, str, str | None]:
    """The status, message and error code a protocol failure is answered with."""
    if isinstance(exc, HeaderTimeout):
        return 408, str(exc), "request_timeout"
    if isinstance(exc, UnsupportedCoding):
        return 501, str(exc), "unsupported_transfer_coding"
    if isinstance(exc, perr.LimitRequestLine):
        return 414, f"the request line is longer than {MAX_REQUEST_LINE} bytes", "uri_too_long"
    if isinstance(exc, perr.LimitRequestHeaders):
        return 431, (f"the request's headers exceed the limits: {exc} (at most "
                     f"{MAX_HEADERS} fields of {MAX_HEADER_FIELD} bytes)"), "headers_too_large"
    if isinstance(exc, perr.UnsupportedTransferCoding):
        return 501, f"unsupported transfer coding: {exc}", "unsupported_transfer_coding"
    if isinstance(exc, perr.ExpectationFailed):
        return 417, f"unsupported expectation: {exc}", "expectation_failed"
    if isinstance(exc, perr.ParseException):
        return 400, f"malformed HTTP request: {exc}", "invalid_http_request"
    return 500, "internal error", None


def error_bytes(status: int, message: str, code: str | None) -> bytes:
    """A whole HTTP/1.1 response carrying an OpenAI-shaped error; the connection closes."""
    etype = "server_error" if status >= 500 else "invalid_request_error"
    body = orjson.dumps({"error": {"message": message, "type": etype, "param": None,
                                   "code": code}})
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
    if status in (429, 503):
        head += "Retry-After: 1\r\n"
    return head.encode("latin-1") + b"\r\n" + body


class Connections:
    """Open connections, in all and per client address, against their caps."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self.open = 0
        self.by_client: Counter[str] = Counter()

    def admit(self, client: str) -> tuple[int, str, str] | None:
        """Count a new connection in, or say why it is refused (it is then not counted)."""
        if self.open >= self.total:
            return 503, (f"the server holds {self.open} connections, its limit; retry "
                         "shortly"), "too_many_connections"
        if client and self.by_client[client] >= self.per_client:
            return 429, (f"too many connections from {client}: at most {self.per_client} "
                         "at once"), "too_many_connections"
        self.open += 1
        if client:
            self.by_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.open -= 1
        if client:
            self.by_client[client] -= 1
            if self.by_client[client] <= 0:
                del self.by_client[client]


class GuardedInput:
    """``wsgi.input`` whose failures are the client's: a read that waits past the body
    timeout is a 408 and a malformed chunk a 400 (both in the OpenAI shape, through the
    app's error handlers), and either closes the connection after the answer."""

    def __init__(self, raw: Any, environ: dict[str, Any]) -> None:
        self.raw, self.environ = raw, environ
        self.started = False

    def _start(self) -> None:
        """Before the first read: a chunked body's limit is the request's
        ``max_content_length`` (set by the app before it reads), and a client waiting
        for ``100 Continue`` gets it now."""
        self.started = True
        reader = getattr(self.raw, "reader", None)
        if isinstance(reader, BoundedChunks):
            request = self.environ.get("werkzeug.request")
            reader.limit = getattr(request, "max_content_length", None)
        go_on = self.environ.pop(CONTINUE, None)
        if go_on is not None:
            go_on()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not self.started:
            self._start()
        try:
            return fn(*args)
        except ChunkTooLarge as e:
            self.environ[CLOSE] = True
            raise RequestEntityTooLarge(str(e)) from None
        except TimeoutError:
            self.environ[CLOSE] = True
            raise RequestTimeout("the request body stopped arriving (no data for the "
                                 "body timeout)") from None
        except perr.ParseException as e:
            self.environ[CLOSE] = True
            raise BadRequest(f"malformed request body: {e}") from None

    def read(self, size: int | None = None) -> bytes:
        return bytes(self._call(self.raw.read, size))

    def readline(self, size: int | None = None) -> bytes:
        return bytes(self._call(self.raw.readline, size))

    def readlines(self, hint: int | None = None) -> list[bytes]:
        return list(self._call(self.raw.readlines, hint))

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


def guard_input(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ["wsgi.input"] = GuardedInput(environ["wsgi.input"], environ)
        return app(environ, start_response)
    return guarded


def raise_open_files_limit() -> int:
    """The soft limit on open files raised to the hard one (each connection is one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


class EdgeWorker(GeventWorker):
    """gunicorn's gevent worker with the caps, time limits and JSON refusals above
    (HTTP/1.1 only: TLS and HTTP/2 end at the load balancer in front)."""

    def init_process(self) -> None:
        st = Settings.from_env()
        self.edge = st
        self.conns = Connections(st.api_max_connections, st.api_max_connections_per_client)
        self.waiting: set[gevent.Greenlet] = set()  # connections between requests
        limit = raise_open_files_limit()
        if limit < st.api_max_connections + 256:
            self.log.warning("open files limit %s is below INFERQ_API_MAX_CONNECTIONS (%s): "
                             "connections past it fail to be accepted", limit,
                             st.api_max_connections)
        super().init_process()

    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM: stop serving, and close the connections that wait for a request
        (their greenlets end; a request in flight is not among them)."""
        super().handle_exit(sig, frame)
        gevent.spawn(gevent.killall, list(self.waiting), block=False)

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi: Any = guard_input(self.wsgi)

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        peer = addr[0] if isinstance(addr, tuple) else ""
        refused = self.conns.admit(peer)
        try:
            if refused is not None:
                self._refuse(client, *refused)
                return
            client.settimeout(self.edge.api_body_timeout_s)
            self._serve(listener, client, addr)
        finally:
            if refused is None:
                self.conns.release(peer)
            try:
                client.close()
            except OSError:
                pass

    def _serve(self, listener: Any, client: Any, addr: Any) -> None:
        st = self.edge
        parser = http.get_parser(self.cfg, client, addr)
        name = listener.getsockname()
        idle = st.api_header_timeout_s  # a new connection's first request
        try:
            while self.alive:
                if not self._arrives(parser, client, idle):
                    return  # nothing sent within the idle time: close without a word
                with gevent.Timeout(st.api_header_timeout_s,
                                    HeaderTimeout("the request line and headers did not "
                                                  f"arrive within {st.api_header_timeout_s:g} s")):
                    self._read_head(parser, client)
                    req = next(parser)
                check_codings(req)
                if not self.handle_request(name, req, client, addr) or not self._drained(parser):
                    return
                idle = st.api_keepalive_s
        except (StopIteration, perr.NoMoreData):
            return
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                self.log.exception("socket error serving a request")
        except Exception as e:  # noqa: BLE001 - every failure is answered, none escapes
            status, message, code = refusal(e)
            if status == 500:
                self.log.exception("error serving a request")
            elif status > 500:  # what the client asked for is not served: one line
                self.log.warning("refused a request from %s: %s %s", addr, status, message)
            else:
                self.log.info("refused a request from %s: %s", addr, message)
            self._refuse(client, status, message, code)

    @staticmethod
    def _read_head(parser: Any, client: Any) -> None:
        """The request line and headers into the parser's buffer. A head that does not
        come whole within ``_TRICKLE_S`` is read every ``_TRICKLE_POLL_S`` from then on,
        all that arrived at once: a client sending a byte at a time costs the loop a
        wake-up per poll, not per byte. Past the largest head the limits allow, the
        parser refuses it."""
        buf = parser.unreader.take_buffered()
        started = time.monotonic()
        while b"\r\n\r\n" not in buf and b"\n\n" not in buf and len(buf) <= _HEAD_BYTES:
            if time.monotonic() - started > _TRICKLE_S:
                gevent.sleep(_TRICKLE_POLL_S)
            data = client.recv(65536)
            if not data:
                break
            buf += data
        parser.unreader.unread(buf)

    @staticmethod
    def _drained(parser: Any) -> bool:
        """Whether what the app left of the body was read past, so that the connection
        can serve the next request: a body that is malformed, too long or too slow to
        discard closes it (its answer has been sent)."""
        try:
            return bool(parser.finish_body(deadline=time.monotonic() + _DRAIN_S,
                                           max_bytes=_DRAIN_BYTES))
        except (perr.ParseException, perr.NoMoreData):
            return False

    def _arrives(self, parser: Any, client: Any, timeout: float) -> bool:
        """Whether a request's first byte is here, or arrives within ``timeout``; the
        wait ends with the worker (``handle_exit``)."""
        if parser.unreader.buf.getbuffer().nbytes:
            return True  # pipelined behind the last request
        me = gevent.getcurrent()
        self.waiting.add(me)
        try:
            wait_read(client.fileno(), timeout=timeout)
        except TimeoutError:
            return False
        finally:
            self.waiting.discard(me)
        return True

    def _refuse(self, client: Any, status: int, message: str, code: str | None) -> None:
        try:
            client.sendall(error_bytes(status, message, code))
        except OSError:
            pass

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> bool:
        """Serve one request; whether the connection may serve another."""
        start = datetime.now()
        environ: dict[str, Any] = {}
        resp = None
        try:
            self.cfg.pre_request(self, req)
            expects = req._expected_100_continue  # sent on the first read, not now
            req._expected_100_continue = False
            if isinstance(getattr(req.body, "reader", None), ChunkedReader):
                req.body.reader = BoundedChunks(req, req.unreader)  # nothing read yet
            resp, environ = wsgi.create(req, sock, addr, listener_name, self.cfg)
            environ["wsgi.multithread"] = True
            if expects:
                environ[CONTINUE] = lambda: sock.sendall(CONTINUE_LINE)
            self.nr += 1
            if not self.alive:
                resp.force_close()
            respiter = self.wsgi(environ, resp.start_response)
            try:
                for item in respiter:
                    resp.write(item)
                resp.close()
            finally:
                self.log.access(resp, req, environ, datetime.now() - start)
                if hasattr(respiter, "close"):
                    respiter.close()
            # A client still waiting for 100 Continue may send its body or not: where
            # the next request would start is unknown.
            return not (resp.should_close() or environ.get(CLOSE) or CONTINUE in environ)
        except OSError:
            raise  # the client went away: nothing to answer
        except gevent.GreenletExit:
            return False  # the worker is stopping past its graceful timeout
        except Exception:
            if resp is not None and resp.headers_sent:
                self.log.exception("error while streaming a response")
                return False  # a torn response: all that is left is to close
            raise
        finally:
            try:
                self.cfg.post_request(self, req, environ, resp)
            except Exception:  # noqa: BLE001
                self.log.exception("post_request hook failed")
