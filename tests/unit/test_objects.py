"""The local object store and the stream helpers of storage/objects.py, on the local
filesystem only (the store contract against S3: tests/integration/test_objects.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.objects import ConcatReader, LocalStore, buffered


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", ""])
def test_local_store_rejects_keys_escaping_root(tmp_path: Path, key: str) -> None:
    root = tmp_path / "root"
    s = LocalStore(root)
    with pytest.raises(ValueError):
        s.put_bytes(key, b"evil")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError):
        s.open(key)


def test_local_store_write_leaves_no_temp_files(tmp_path: Path) -> None:
    s = LocalStore(tmp_path)

    class Boom:
        def __init__(self) -> None:
            self.calls = 0

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 1:
                raise OSError("stream broke")
            return b"partial"

    s.put_bytes("obj", b"old")
    with pytest.raises(OSError):
        s.put_stream("obj", Boom())  # type: ignore[arg-type]
    assert s.get_bytes("obj") == b"old"  # the write was atomic
    assert [p.name for p in tmp_path.iterdir()] == ["obj"]
    assert s.list("") == ["obj"]


def test_concat_reader() -> None:
    blocks = [b"ab", b"", b"cdef", b"g", b""]
    r = ConcatReader(iter(blocks))
    assert r.read(1) == b"a"
    assert r.read(100) == b"b"  # a raw read returns at most the rest of one block
    assert r.read(3) == b"cde"  # empty blocks are skipped
    assert r.read() == b"fg"
    assert r.read() == b""
    assert ConcatReader(iter([])).read() == b""


def test_concat_reader_buffered_lines_across_blocks() -> None:
    blocks = [b'{"a": 1}\n{"b"', b": 2}\n", b"", b"{", b'"c": 3}\n']
    r = buffered(ConcatReader(iter(blocks)), size=4)
    assert r.readline() == b'{"a": 1}\n'
    assert r.readline() == b'{"b": 2}\n'
    assert r.readline() == b'{"c": 3}\n'
    assert r.readline() == b""
