"""The object store a URL names: ``file:///path`` (a local directory) or ``s3://bucket/prefix``."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from storage.objects import LocalStore, ObjectStore
from storage.s3_store import S3Store


def open_store(url: str, endpoint_url: str | None = None) -> ObjectStore:
    """``file:///path`` or ``s3://bucket/prefix``."""
    u = urlparse(url)
    if u.scheme == "file":
        return LocalStore(Path(u.path))
    if u.scheme == "s3":
        return S3Store(u.netloc, u.path, endpoint_url=endpoint_url)
    raise ValueError(f"unsupported object store URL {url!r} (use file:// or s3://)")
