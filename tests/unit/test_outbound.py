"""storage/outbound.py: which URLs may be requested, and that a request goes to the
address its one resolution checked.

IP literals resolve without DNS. Where a test needs a host name with chosen answers,
DNS is faked at the process edge (``socket.getaddrinfo``); receivers are real HTTP(S)
servers on 127.0.0.1.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs.core.settings import Settings
from storage import outbound
from storage.outbound import OutboundRefused, check_url, post

NONE: frozenset[str] = frozenset()
REAL_GETADDRINFO = socket.getaddrinfo

# (url, words the reason must contain)
REFUSED_ADDRESSES = [
    ("http://127.0.0.1/hook", "loopback"),
    ("http://127.8.9.10:8080/", "loopback"),
    ("http://127.1/", "loopback"),  # inet_aton shorthand: the resolved address is checked
    ("http://2130706433/", "loopback"),  # 127.0.0.1 as one number
    ("http://0x7f000001/", "loopback"),
    ("http://10.0.0.1/", "private"),
    ("http://10.255.255.255/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://172.31.255.254/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),  # cloud metadata
    ("http://169.254.0.1/", "link-local"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://100.127.255.254/", "carrier-grade NAT"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://0.1.2.3/", "'this network'"),
    ("http://224.0.0.1/", "multicast"),
    ("http://239.255.255.250:1900/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://255.255.255.255/", "reserved"),
    ("http://192.0.0.8/", "IETF protocol assignment"),
    ("http://198.18.0.1/", "benchmarking"),
    ("http://192.0.2.1/", "private"),  # documentation (TEST-NET-1)
    ("http://[::1]/", "loopback"),
    ("http://[::]/", "unspecified"),
    ("http://[::ffff:127.0.0.1]/", "loopback (as 127.0.0.1)"),
    ("http://[::ffff:10.1.2.3]/", "private (as 10.1.2.3)"),
    ("http://[::ffff:169.254.169.254]/", "link-local (as 169.254.169.254)"),
    ("http://[64:ff9b::a9fe:a9fe]/", "link-local (as 169.254.169.254)"),  # NAT64
    ("http://[2002:7f00:1::]/", "loopback (as 127.0.0.1)"),  # 6to4
    ("http://[fe80::1]/", "link-local"),
    ("http://[fc00::1]/", "private (unique local)"),
    ("http://[fd12:3456::1]/", "private (unique local)"),
    ("http://[fec0::1]/", "site-local"),
    ("http://[ff02::1]/", "multicast"),
    ("https://[::1]:8443/", "loopback"),
    ("http://localhost/", "resolves to 127.0.0.1, a loopback"),
    ("http://LOCALHOST./", "resolves to 127.0.0.1, a loopback"),
]

REFUSED_URLS = [
    ("ftp://files.example.com/x", "only http:// and https://"),
    ("file:///etc/passwd", "only http:// and https://"),
    ("gopher://1.1.1.1/", "only http:// and https://"),
    ("javascript:alert(1)", "only http:// and https://"),
    ("//1.1.1.1/hook", "without a scheme"),
    ("1.1.1.1/hook", "without a scheme"),
    ("", "empty"),
    ("http:///hook", "no host"),
    ("http://user:secret@1.1.1.1/", "credentials"),
    ("http://user@1.1.1.1/", "credentials"),
    ("http://@1.1.1.1/", "credentials"),
    ("http://1.1.1.1:0/", "port"),
    ("http://1.1.1.1:65536/", "port"),
    ("http://1.1.1.1:http/", "port"),
    ("http://1.1.1.1/a b", "whitespace"),
    ("http://1.1.1.1/\r\nX-Injected: 1", "whitespace or control"),
    ("http://" + "a" * 3000 + ".com/", "longer than"),
]


@pytest.mark.parametrize(("url", "reason"), REFUSED_ADDRESSES)
def test_non_public_addresses_are_refused(url: str, reason: str) -> None:
    with pytest.raises(OutboundRefused) as err:
        check_url(url, NONE)
    assert reason in err.value.reason
    assert "only public addresses" in err.value.reason
    assert not err.value.transient


@pytest.mark.parametrize(("url", "reason"), REFUSED_URLS)
def test_urls_that_are_not_plain_http_are_refused(url: str, reason: str) -> None:
    with pytest.raises(OutboundRefused) as err:
        check_url(url, frozenset({"1.1.1.1"}))  # allow-listing a host allows no more
    assert reason in err.value.reason


@pytest.mark.parametrize("url", ["http://1.1.1.1/", "https://8.8.8.8:8443/hooks?a=1",
                                 "http://[2606:4700:4700::1111]/", "HTTPS://1.1.1.1"])
def test_public_addresses_are_allowed(url: str) -> None:
    check_url(url, NONE)  # raises if refused


def test_the_allow_list_names_hosts_as_urls_spell_them() -> None:
    allow = Settings(webhook_allow_hosts=" 127.0.0.1, [::1],Localhost. ,").webhook_allow_host_set
    assert allow == {"127.0.0.1", "::1", "localhost"}
    for url in ["http://127.0.0.1:8080/hook", "http://[::1]:9/", "http://LocalHost./x"]:
        check_url(url, allow)
    only_ip = frozenset({"127.0.0.1"})
    with pytest.raises(OutboundRefused, match="loopback"):  # the name is not the address
        check_url("http://localhost:8080/", only_ip)
    with pytest.raises(OutboundRefused, match="loopback"):  # nor another spelling of it
        check_url("http://127.1:8080/", only_ip)


def test_outbound_settings_defaults() -> None:
    st = Settings()
    assert st.webhook_allow_host_set == frozenset()
    assert (st.webhook_connect_timeout_s, st.webhook_read_timeout_s) == (5.0, 10.0)
    assert st.webhook_max_response_bytes == 4096


class FakeDNS:
    """``socket.getaddrinfo`` answering names in ``answers`` from a list of lists of
    addresses, one list per lookup (the last repeats); other hosts resolve normally."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.lookups: list[str] = []

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in self.answers:
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        self.lookups.append(host)
        seq = self.answers[host]
        addrs = seq[min(len(self.lookups) - 1, len(seq) - 1)]
        out: list[Any] = []
        for a in addrs:
            if ipaddress.ip_address(a).version == 6:
                out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, int(port), 0, 0)))
            else:
                out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port))))
        return out


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def install(answers: dict[str, list[list[str]]]) -> FakeDNS:
        dns = FakeDNS(answers)
        monkeypatch.setattr(socket, "getaddrinfo", dns)
        return dns
    yield install


def test_a_host_is_refused_when_any_of_its_addresses_is_not_public(fake_dns: Any) -> None:
    fake_dns({"mixed.example": [["1.1.1.1", "10.0.0.7"]],
              "v6.example": [["2606:4700:4700::1111", "::ffff:192.168.0.1"]],
              "public.example": [["1.1.1.1", "2606:4700:4700::1111"]]})
    with pytest.raises(OutboundRefused, match="resolves to 10.0.0.7, a private"):
        check_url("https://mixed.example/hook", NONE)
    with pytest.raises(OutboundRefused, match=r"private \(as 192.168.0.1\)"):
        check_url("https://v6.example/hook", NONE)
    check_url("https://public.example/hook", NONE)


def test_an_unresolvable_host_is_refused_as_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_answer(*_a: Any, **_k: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_answer)
    with pytest.raises(OutboundRefused) as err:
        check_url("https://gone.example/hook", NONE)
    assert err.value.transient and "cannot be resolved" in err.value.reason
    res = send("https://gone.example/hook", NONE)  # at delivery: a network error, retried
    assert res.status is None and res.error is not None and "cannot be resolved" in res.error


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread that records what it receives and
    answers 200 with the body it got."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append((self.path, dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def send(url: str, allow: frozenset[str], **kw: Any) -> outbound.OutboundResult:
    args: dict[str, Any] = {"connect_timeout": 2.0, "read_timeout": 5.0, "max_body": 4096}
    args.update(kw)
    return post(url, b'{"n": 1}', {"Content-Type": "application/json"}, allow_hosts=allow,
                **args)


def test_dns_rebinding_cannot_move_a_request_to_a_private_address(
        fake_dns: Any, receiver: Receiver) -> None:
    """The check sees a public address, a second lookup would see 127.0.0.1 where a
    receiver listens: the request goes to the checked address, never the receiver."""
    # Connecting to the public answer fails (no route, or a timeout): that is the point.
    dns = fake_dns({"rebind.example": [["1.1.1.1"], ["127.0.0.1"]]})
    res = send(f"http://rebind.example:{receiver.port}/hook", NONE, connect_timeout=0.5)
    assert dns.lookups == ["rebind.example"]
    assert res.status is None and res.error is not None and "1.1.1.1" in res.error
    assert receiver.requests == []


def test_the_request_goes_to_the_checked_address_under_the_urls_host(
        fake_dns: Any, receiver: Receiver) -> None:
    """An allow-listed name whose first answer is the receiver and whose next answer
    would be unreachable: one lookup, the receiver gets it, with the URL's Host."""
    dns = fake_dns({"hooks.internal": [["127.0.0.1"], ["10.255.255.1"]]})
    url = f"http://hooks.internal:{receiver.port}/hook?x=1"
    res = send(url, frozenset({"hooks.internal"}))
    assert (res.status, res.body, res.error) == (200, b'{"n": 1}', None)
    assert dns.lookups == ["hooks.internal"]
    path, headers, body = receiver.requests[0]
    assert (path, body) == ("/hook?x=1", b'{"n": 1}')
    assert headers["Host"] == f"hooks.internal:{receiver.port}"
    assert headers["Content-Type"] == "application/json"
    assert headers["Connection"] == "close"


def test_the_callers_headers_cannot_change_the_framing(receiver: Receiver) -> None:
    res = post(f"http://127.0.0.1:{receiver.port}/h", b"abc",
               {"Host": "evil.example", "Content-Length": "999", "Transfer-Encoding": "chunked",
                "X-Ok": "1"},
               allow_hosts=frozenset({"127.0.0.1"}), connect_timeout=2, read_timeout=5,
               max_body=100)
    assert (res.status, res.body) == (200, b"abc")
    headers = receiver.requests[0][1]
    assert headers["Host"] == f"127.0.0.1:{receiver.port}"
    assert headers["Content-Length"] == "3" and "Transfer-Encoding" not in headers
    assert headers["X-Ok"] == "1" and headers["User-Agent"] == outbound.USER_AGENT


def tls_pair(tmp_path: Path, names: list[str]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for ``names`` and a client
    context that trusts only that certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem = tmp_path / "cert.pem"
    key_pem = tmp_path / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_pem, key_pem)
    client = ssl.create_default_context(cafile=str(cert_pem))
    return server, client


def test_https_to_a_pinned_address_checks_the_urls_host(fake_dns: Any, tmp_path: Path) -> None:
    """TLS goes to the checked address with the URL's host as SNI and as the name the
    certificate must carry."""
    server_ctx, client_ctx = tls_pair(tmp_path, ["hooks.example"])
    dns = fake_dns({"hooks.example": [["127.0.0.1"], ["10.0.0.1"]],
                    "other.example": [["127.0.0.1"]]})
    tls_receiver = Receiver(tls=server_ctx)
    try:
        allow = frozenset({"hooks.example", "other.example"})
        res = send(f"https://hooks.example:{tls_receiver.port}/tls", allow,
                   ssl_context=client_ctx)
        assert (res.status, res.body, res.error) == (200, b'{"n": 1}', None)
        assert dns.lookups == ["hooks.example"]
        assert tls_receiver.requests[0][1]["Host"] == f"hooks.example:{tls_receiver.port}"
        wrong = send(f"https://other.example:{tls_receiver.port}/tls", allow,
                     ssl_context=client_ctx)
        assert wrong.status is None and wrong.error is not None
        assert "certificate" in wrong.error.lower()
        assert len(tls_receiver.requests) == 1
    finally:
        tls_receiver.close()


def test_a_refused_target_raises_before_any_connection(fake_dns: Any,
                                                        receiver: Receiver) -> None:
    fake_dns({"inside.example": [["127.0.0.1"]]})
    with pytest.raises(OutboundRefused, match="loopback"):
        send(f"http://inside.example:{receiver.port}/", NONE)
    with pytest.raises(OutboundRefused, match="loopback"):
        send(f"http://localhost:{receiver.port}/", frozenset({"127.0.0.1"}))
    assert receiver.requests == []


def test_stacks_allow_local_receivers_unless_told_otherwise(tmp_path: Path) -> None:
    from cli.stack import Stack

    stack = Stack(Settings(data_dir=tmp_path))
    assert stack.settings.webhook_allow_host_set == {"127.0.0.1"}
    assert stack.env()["INFERQ_WEBHOOK_ALLOW_HOSTS"] == "127.0.0.1"  # its children's too
    told = Stack(Settings(data_dir=tmp_path, webhook_allow_hosts=""))
    assert told.settings.webhook_allow_host_set == frozenset()
    named = Stack(Settings(data_dir=tmp_path, webhook_allow_hosts="hooks.lan"))
    assert named.env()["INFERQ_WEBHOOK_ALLOW_HOSTS"] == "hooks.lan"


def test_an_explicit_empty_allow_list_in_the_environment_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.stack import Stack

    monkeypatch.setenv("INFERQ_WEBHOOK_ALLOW_HOSTS", "")
    assert Stack(Settings.from_env(data_dir=tmp_path)).settings.webhook_allow_hosts == ""
