"""A 1 GB upload keeps the API's memory flat: the body is streamed (werkzeug spools
it to disk, boto3 sends it in bounded multipart parts), never held whole."""

from __future__ import annotations

import http.client
import threading
import time

import psutil
import pytest

pytestmark = pytest.mark.slow

GB = 1024**3
LINE = b'{"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'


class MultipartBody:
    """A multipart/form-data body generated on the fly (the client holds no copy either)."""

    boundary = "inferqboundary7d2a"

    def __init__(self, size: int) -> None:
        self.head = (f"--{self.boundary}\r\nContent-Disposition: form-data; name=\"purpose\""
                     f"\r\n\r\nbatch\r\n--{self.boundary}\r\nContent-Disposition: form-data; "
                     f"name=\"file\"; filename=\"big.jsonl\"\r\nContent-Type: "
                     f"application/jsonl\r\n\r\n").encode()
        self.tail = f"\r\n--{self.boundary}--\r\n".encode()
        self.size = size
        self.length = len(self.head) + size + len(self.tail)
        self.block = LINE * (1024 * 1024 // len(LINE))

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield self.head
        left = self.size
        while left:
            chunk = self.block[: min(left, len(self.block))]
            left -= len(chunk)
            yield chunk
        yield self.tail


def rss_tree(pid: int) -> int:
    p = psutil.Process(pid)
    return sum(x.memory_info().rss for x in [p, *p.children(recursive=True)])


def post_upload(port: int, key: str, size: int) -> tuple[int, bytes]:
    body = MultipartBody(size)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/files", body=iter(body), headers={
        "Authorization": f"Bearer {key}", "Content-Length": str(body.length),
        "Content-Type": f"multipart/form-data; boundary={body.boundary}"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_one_gigabyte_upload_keeps_api_memory_flat(stack, tenant_key, sdk) -> None:  # type: ignore[no-untyped-def]
    api_pid = stack.procs["api"].pid
    # Warm up with a 64 MiB multipart upload: imports, the S3 client and its part buffers
    # are one-off costs; what must not happen is growth with the size of the upload.
    status, _ = post_upload(stack.port, tenant_key, 64 * 2**20)
    assert status == 200
    before = rss_tree(api_pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_tree(api_pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    status, payload = post_upload(stack.port, tenant_key, GB)
    done.set()
    t.join()
    assert status == 200, payload[:500]
    import json

    f = json.loads(payload)
    assert f["bytes"] == GB
    assert sdk.files.retrieve(f["id"]).bytes == GB
    growth = peak[0] - before
    print(f"API RSS before {before / 2**20:.0f} MiB, peak {peak[0] / 2**20:.0f} MiB, "
          f"growth {growth / 2**20:.0f} MiB for a 1024 MiB upload")
    assert growth < 48 * 2**20
    sdk.files.delete(f["id"])
