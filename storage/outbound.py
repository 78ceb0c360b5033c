"""Requests to URLs that clients name (webhook deliveries, callbacks), safe against SSRF.

A client-supplied URL must not reach the service's own network: loopback, private
ranges, link-local (169.254.169.254 is the cloud metadata service), carrier-grade NAT,
multicast, reserved and unspecified addresses are refused, as are the IPv6 forms that
embed such an IPv4 address (``::ffff:127.0.0.1``, 6to4, NAT64). A host named in the
allow-list (``INFERQ_WEBHOOK_ALLOW_HOSTS``) skips the address check, nothing else.

The host is resolved once, every address it has is checked, and the connection goes
to a checked address: there is no second DNS lookup a rebinding answer could slip a
private address into. The URL's host still names the request (``Host`` header, TLS SNI
and certificate check), so virtual hosts and https work as with any client.

Why httpcore2 (the transport under httpx2, the SDK's client) with a network backend of
this module's own: httpcore2's public ``NetworkBackend`` interface is the one place
where "open a TCP connection to host:port" can be answered with "to this address",
while the HTTP/1.1 framing, TLS with SNI and exceptions stay the library's. httpcore2
never follows redirects (a 3xx is a result), and the stream of our own enforces the
deadlines: the connect timeout bounds TCP and TLS set-up (across all addresses), the
read timeout bounds everything after it as a whole, so a receiver that drips a byte at
a time cannot hold a sender longer than that. At most ``max_body`` bytes of a response
body are kept; the connection is then closed. Every call has its own connection pool
and backend, so concurrent calls from threads share nothing but an SSL context.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore2

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SockAddr = tuple[Any, ...]

DEFAULT_PORTS = {"http": 80, "https": 443}
USER_AGENT = "inferq-webhooks/1"
MAX_URL_CHARS = 2048
# Ranges the ipaddress module's properties do not name (or not in every Python).
CARRIER_GRADE_NAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
REFUSED_NETWORKS: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (CARRIER_GRADE_NAT, "carrier-grade NAT"),
    (ipaddress.ip_network("0.0.0.0/8"), "'this network'"),
    (ipaddress.ip_network("192.0.0.0/24"), "IETF protocol assignment"),
    (ipaddress.ip_network("198.18.0.0/15"), "benchmarking"),
    (ipaddress.ip_network("fc00::/7"), "private (unique local)"),
)


class OutboundRefused(Exception):
    """The URL may not be requested; ``reason`` says why, in words a client can act on.
    ``transient`` is true when the reason may go away (its host did not resolve now):
    only :func:`check_url` raises those; :func:`post` returns them as an ``error``."""

    def __init__(self, reason: str, *, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


@dataclass(frozen=True)
class OutboundResult:
    """What a request came to. ``status`` is the receiver's HTTP status (a redirect is
    one too: it is never followed), None when no status line arrived, and then ``error``
    says what happened (connect failure, timeout, reset ...). ``body`` holds at most the
    ``max_body`` first bytes of the response body (fewer when reading it timed out)."""

    status: int | None
    body: bytes
    error: str | None


@dataclass(frozen=True)
class Target:
    """A checked URL: where it points and the addresses a request may connect to."""

    scheme: str
    host: str  # lower case, IDNA-encoded, no brackets, no trailing dot
    port: int
    path: str  # path and query, as sent in the request line
    addresses: tuple[tuple[int, SockAddr], ...]  # (family, sockaddr) of getaddrinfo

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


def non_public_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address (e.g. "loopback"); None for a public one."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and any(ip in net for net in NAT64):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = non_public_reason(embedded)
            return f"{inner} (as {embedded})" if inner else None
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    for net, name in REFUSED_NETWORKS:
        if ip.version == net.version and ip in net:
            return name
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site-local"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-public"
    return None


def _parse(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of an absolute http(s) URL; OutboundRefused if not."""
    if not isinstance(url, str) or not url:
        raise OutboundRefused("the URL is empty")
    if len(url) > MAX_URL_CHARS:
        raise OutboundRefused(f"the URL is longer than {MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise OutboundRefused("the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise OutboundRefused(f"the URL is not valid: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise OutboundRefused("only http:// and https:// URLs are allowed, not "
                              f"{scheme + '://' if scheme else 'a URL without a scheme'}")
    if "@" in parts.netloc:
        raise OutboundRefused("credentials in the URL (user:password@) are not allowed")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise OutboundRefused("the URL has no host")
    try:
        port = parts.port
    except ValueError:
        raise OutboundRefused("the URL's port must be a number from 1 to 65535") from None
    if port == 0:
        raise OutboundRefused("the URL's port must be a number from 1 to 65535")
    try:
        host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise OutboundRefused(f"the URL's host {host!r} is not a valid host name") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return scheme, host, port or DEFAULT_PORTS[scheme], path


def _resolve(host: str, port: int) -> list[tuple[int, SockAddr]]:
    """Every TCP address of ``host``: the one DNS lookup of a request."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise OutboundRefused(f"the host {host} cannot be resolved: {exc}",
                              transient=True) from None
    found: list[tuple[int, SockAddr]] = [
        (family, sockaddr) for family, _t, _p, _c, sockaddr in infos
        if family in (socket.AF_INET, socket.AF_INET6)]
    if not found:
        raise OutboundRefused(f"the host {host} has no IPv4 or IPv6 address", transient=True)
    return found


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def resolve(url: str, allow_hosts: AbstractSet[str]) -> Target:
    """The checked target of ``url``: resolved once, every address checked unless its
    host is allow-listed. OutboundRefused when it may not be requested."""
    scheme, host, port, path = _parse(url)
    addresses = _resolve(host, port)
    if host not in allow_hosts:
        for _family, sockaddr in addresses:
            ip = ipaddress.ip_address(sockaddr[0])
            reason = non_public_reason(ip)
            if reason:
                article = "an" if reason[0] in "aeiou" else "a"
                what = f"is {article}" if _literal(host) == ip else f"resolves to {ip}, {article}"
                raise OutboundRefused(f"the host {host} {what} {reason} address: only "
                                      "public addresses may be requested")
    return Target(scheme, host, port, path, tuple(dict.fromkeys(addresses)))


def check_url(url: str, allow_hosts: frozenset[str]) -> None:
    """Raise OutboundRefused unless ``url`` may be requested now (see :func:`resolve`)."""
    resolve(url, allow_hosts)


_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """The system's trust store (httpcore2's default), made once and shared."""
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            _ssl_context = httpcore2.default_ssl_context()
        return _ssl_context


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self, timeout: float | None, error: type[Exception], what: str) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise error(f"{what} took longer than {self.seconds:g} s")
        return left if timeout is None else min(timeout, left)


class _Stream(httpcore2.NetworkStream):
    """A connected socket under two deadlines: set-up (TLS) under the connect deadline,
    and the request and its whole response under the read deadline, which starts at
    the first byte written."""

    def __init__(self, sock: socket.socket, connect: _Deadline, read_timeout: float) -> None:
        self._sock = sock
        self._connect = connect
        self._read_timeout = read_timeout
        self._io: _Deadline | None = None

    def _io_left(self, timeout: float | None, error: type[Exception]) -> float:
        if self._io is None:
            self._io = _Deadline(self._read_timeout)
        return self._io.left(timeout, error, "the request and its response")

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            self._sock.settimeout(self._io_left(timeout, httpcore2.ReadTimeout))
            return self._sock.recv(max_bytes)
        except TimeoutError as exc:
            raise httpcore2.ReadTimeout(f"no answer within {self._read_timeout:g} s") from exc
        except OSError as exc:
            raise httpcore2.ReadError(str(exc)) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        try:
            while view:
                self._sock.settimeout(self._io_left(timeout, httpcore2.WriteTimeout))
                view = view[self._sock.send(view):]
        except TimeoutError as exc:
            raise httpcore2.WriteTimeout(f"sending took over {self._read_timeout:g} s") from exc
        except OSError as exc:
            raise httpcore2.WriteError(str(exc)) from exc

    def close(self) -> None:
        self._sock.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        try:
            self._sock.settimeout(self._connect.left(timeout, httpcore2.ConnectTimeout,
                                                     "connecting"))
            tls = ssl_context.wrap_socket(self._sock, server_hostname=server_hostname)
        except TimeoutError as exc:
            self.close()
            raise httpcore2.ConnectTimeout("the TLS handshake timed out") from exc
        except OSError as exc:  # ssl.SSLError (a bad certificate ...) is one
            self.close()
            raise httpcore2.ConnectError(f"TLS: {exc}") from exc
        except BaseException:
            self.close()
            raise
        return _Stream(tls, self._connect, self._read_timeout)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object" and isinstance(self._sock, ssl.SSLSocket):
            return self._sock._sslobj  # type: ignore[attr-defined]
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        if info == "socket":
            return self._sock
        if info == "is_readable":
            return False  # one request per connection: never asked of an idle one
        return None


class _PinnedBackend(httpcore2.NetworkBackend):
    """Connects to the target's checked addresses, whatever host httpcore2 asks for."""

    def __init__(self, target: Target, connect_timeout: float, read_timeout: float) -> None:
        self._target = target
        self._connect = _Deadline(connect_timeout)
        self._read_timeout = read_timeout

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore2.NetworkStream:
        errors = []
        for family, sockaddr in self._target.addresses:
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            try:
                sock.settimeout(self._connect.left(timeout, httpcore2.ConnectTimeout,
                                                   "connecting"))
                sock.connect(sockaddr)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except TimeoutError:
                sock.close()
                errors.append(f"{sockaddr[0]}: timed out")
                continue
            except OSError as exc:
                sock.close()
                errors.append(f"{sockaddr[0]}: {exc.strerror or exc}")
                continue
            except BaseException:
                sock.close()
                raise
            return _Stream(sock, self._connect, self._read_timeout)
        raise httpcore2.ConnectError(f"cannot connect to {self._target.host}:"
                                     f"{self._target.port} ({'; '.join(errors)})")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore2.NetworkStream:
        raise httpcore2.ConnectError("unix sockets are not outbound targets")


# Headers this module sets itself: the connection's framing is not the caller's to choose.
OWN_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


def post(url: str, body: bytes, headers: Mapping[str, str], *, allow_hosts: frozenset[str],
         connect_timeout: float, read_timeout: float, max_body: int,
         ssl_context: ssl.SSLContext | None = None) -> OutboundResult:
    """POST ``body`` to ``url`` with ``headers``, connecting only to the addresses the
    one resolution checked. Raises OutboundRefused for a refused target; every network
    outcome (a host that does not resolve now, refused connection, timeout, reset, bad
    TLS) is an OutboundResult with ``error``. Redirects are results, never followed.
    ``ssl_context``: the trust store for https (default: the system's)."""
    try:
        target = resolve(url, allow_hosts)
    except OutboundRefused as exc:
        if exc.transient:
            return OutboundResult(None, b"", f"failed: {exc.reason}")
        raise
    sent = [(k, v) for k, v in headers.items() if k.lower() not in OWN_HEADERS]
    if not any(k.lower() == "user-agent" for k, _ in sent):
        sent.append(("User-Agent", USER_AGENT))
    sent += [("Host", target.host_header), ("Content-Length", str(len(body))),
             ("Accept-Encoding", "identity"), ("Connection", "close")]
    request_url = httpcore2.URL(scheme=target.scheme, host=target.host, port=target.port,
                                target=target.path)
    timeouts = {"connect": connect_timeout, "read": read_timeout, "write": read_timeout,
                "pool": connect_timeout}
    backend = _PinnedBackend(target, connect_timeout, read_timeout)
    status: int | None = None
    kept = bytearray()
    try:
        with httpcore2.ConnectionPool(ssl_context=ssl_context or default_ssl_context(),
                                      network_backend=backend, max_connections=1,
                                      http1=True, http2=False, retries=0) as pool, \
                pool.stream("POST", request_url, headers=sent, content=body,
                            extensions={"timeout": timeouts}) as response:
            status = response.status
            for piece in response.iter_stream():
                kept += piece[:max_body - len(kept)]
                if len(kept) >= max_body:
                    break  # the rest is never read: closing drops the connection
    except (httpcore2.TimeoutException, httpcore2.NetworkError, httpcore2.ProtocolError,
            OSError) as exc:
        if status is None:
            kind = "timed out" if isinstance(exc, httpcore2.TimeoutException) else "failed"
            return OutboundResult(None, b"", f"{kind}: {exc or type(exc).__name__}")
    return OutboundResult(status, bytes(kept), None)
