"""Through the real HTTP server (gunicorn, as ``inferq up`` and ``inferq api`` run it):
an oversized request line or too many header fields are answered in the OpenAI error
shape, not with the server's own page of HTML. (A single header field over 8190
bytes is still refused by gunicorn itself, which allows no larger one.)"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


def send(base_url: str, path: str, headers: dict[str, str]) -> tuple[int, str, Any]:
    u = urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, resp.getheader("content-type", ""), json.loads(body)
    finally:
        conn.close()


def test_oversized_requests_get_openai_shaped_errors(stack, tenant_key: str) -> None:  # type: ignore[no-untyped-def]
    auth = {"Authorization": f"Bearer {tenant_key}"}
    cases = [("/v1/batches?after=" + "x" * 20_000, auth, 414, "uri_too_long"),
             ("/v1/batches", {**auth, **{f"x-h{i}": "1" for i in range(150)}}, 431,
              "headers_too_large")]
    for path, headers, status, code in cases:
        got, ctype, body = send(stack.base_url, path, headers)
        assert (got, ctype) == (status, "application/json")
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == code
    got, _, body = send(stack.base_url, "/v1/batches?limit=1", auth)
    assert got == 200 and body["object"] == "list"
