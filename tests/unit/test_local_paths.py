"""Local paths that cannot leave their root (storage.localfs, storage.datasets'
file:// listings and pinned reads, storage.objects.LocalStore), each case written as
the attack: a link to a directory, a file or /etc/passwd, a FIFO, a key through a link.
The real filesystem of a temporary directory; no server involved."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from storage import datasets as ds
from storage import localfs
from storage.objects import LocalStore, ObjectNotFound


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """Two projects' locations, a/ and b/, with b's rows in b/in/."""
    for name in ("a/own/1.jsonl", "b/in/secret.jsonl", "b/outtarget/keep"):
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b'{"custom_id": "x", "input": "row"}\n')
    (tmp_path / "b/outtarget/keep").unlink()
    return tmp_path


def listing(lake: Path, uri_path: str) -> list[str]:
    root = ds.parse(f"file://{lake}/a/")
    return [o.uri for o in ds.list_objects(ds.parse(f"file://{lake}/{uri_path}"), 100, root)]


def within_seconds(fn: Callable[[], object], seconds: float = 30) -> object:
    """``fn``'s result, or a failure if it has not returned within ``seconds`` (a
    generous bound: what it guards against is blocking forever)."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(_capture(fn)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "it blocked"
    return out[0]


def _capture(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - handed to the test
        return e


def test_a_link_below_the_root_is_named_and_refused(lake: Path) -> None:
    os.symlink(lake / "b/in", lake / "a/linkdir")
    with pytest.raises(localfs.UnsafePath, match=f"{lake}/a/linkdir is a symbolic link"):
        localfs.real_under(f"{lake}/a/", f"{lake}/a/linkdir/x.jsonl")
    # The root's own links are the admin's: resolved. Missing components are kept.
    os.symlink(lake / "a", lake / "alias")
    assert localfs.real_under(f"{lake}/alias/", f"{lake}/alias/new/dir/") == \
        f"{os.path.realpath(lake)}/a/new/dir/"
    with pytest.raises(localfs.UnsafePath, match="is not under"):
        localfs.real_under(f"{lake}/a/", f"{lake}/ab/x")


def test_a_symlinked_directory_file_or_glob_is_refused(lake: Path) -> None:
    assert listing(lake, "a/") == [f"file://{lake}/a/own/1.jsonl"]
    os.symlink(lake / "b/in", lake / "a/linkdir")
    # The link itself named, as a prefix, or walked past by a prefix or a ** glob.
    for uri in ("a/linkdir/", "a/linkdir/secret.jsonl", "a/linkdir/*.jsonl"):
        with pytest.raises(ds.NotFollowed, match="a/linkdir is a symbolic link"):
            listing(lake, uri)
    for uri in ("a/", "a/**.jsonl", "a/*/secret.jsonl"):
        with pytest.raises(ds.NotFollowed, match="a/linkdir: .*symbolic link"):
            listing(lake, uri)
    # Links the URI does not name are left alone: a glob that cannot reach it, a
    # hidden one.
    assert listing(lake, "a/*.jsonl") == []
    assert listing(lake, "a/own/**.jsonl") == [f"file://{lake}/a/own/1.jsonl"]
    os.rename(lake / "a/linkdir", lake / "a/_linkdir")
    assert listing(lake, "a/") == [f"file://{lake}/a/own/1.jsonl"]

    os.symlink(lake / "b/in/secret.jsonl", lake / "a/own/2.jsonl")
    for uri in ("a/own/", "a/own/2.jsonl", "a/**.jsonl", "a/own/*.jsonl"):
        with pytest.raises(ds.NotFollowed, match="own/2.jsonl: .*symbolic link"):
            listing(lake, uri)


def test_passwd_linked_into_a_location_is_never_read(lake: Path) -> None:
    os.symlink("/etc/passwd", lake / "a/passwd.jsonl")
    with pytest.raises(ds.NotFollowed, match="passwd.jsonl: .*symbolic link"):
        listing(lake, "a/passwd.jsonl")
    # Listed before the link was put in its place: the pinned read refuses it too.
    (lake / "a/passwd.jsonl").unlink()
    (lake / "a/passwd.jsonl").write_bytes(b"{}\n")
    [obj] = ds.list_objects(ds.parse(f"file://{lake}/a/passwd.jsonl"), 10)
    (lake / "a/passwd.jsonl").unlink()
    os.symlink("/etc/passwd", lake / "a/passwd.jsonl")
    with pytest.raises(ds.SourceChanged, match="symbolic link"):
        ds.open_pinned(obj)
    # A directory of its path swapped for a link: refused as well.
    (lake / "a/own/1.jsonl").write_bytes(b"{}\n")
    [obj] = ds.list_objects(ds.parse(f"file://{lake}/a/own/1.jsonl"), 10)
    os.rename(lake / "a/own", lake / "a/own-old")
    os.symlink(lake / "a/own-old", lake / "a/own")
    with pytest.raises(ds.SourceChanged, match="a/own is a symbolic link"):
        ds.open_pinned(obj)


def test_a_fifo_is_refused_and_never_blocks(lake: Path) -> None:
    (lake / "a/fifo").mkdir()
    os.mkfifo(lake / "a/fifo/x.jsonl")
    for uri in ("a/fifo/", "a/fifo/x.jsonl", "a/**.jsonl"):
        got = within_seconds(partial(listing, lake, uri))
        assert isinstance(got, ds.NotFollowed) and "x.jsonl is a FIFO" in str(got), got
    assert listing(lake, "a/fifo/*.parquet") == []  # one the glob does not name
    # Listed as a file, then a FIFO put in its place: refused, without blocking.
    os.unlink(lake / "a/fifo/x.jsonl")
    (lake / "a/fifo/x.jsonl").write_bytes(b"{}\n")
    [obj] = ds.list_objects(ds.parse(f"file://{lake}/a/fifo/x.jsonl"), 10)
    os.unlink(lake / "a/fifo/x.jsonl")
    os.mkfifo(lake / "a/fifo/x.jsonl")
    got = within_seconds(lambda: ds.open_pinned(obj))
    assert isinstance(got, ds.SourceChanged) and "is a FIFO" in str(got), got
    with pytest.raises(localfs.UnsafePath, match="FIFO"):
        localfs.open_file(str(lake / "a/fifo/x.jsonl"))


def test_holds_objects_counts_links_without_walking_them(lake: Path) -> None:
    out = ds.parse(f"file://{lake}/a/out/")
    assert not ds.holds_objects(out)
    (lake / "a/out/sub").mkdir(parents=True)
    assert not ds.holds_objects(out)  # empty directories hold nothing
    os.symlink(lake / "b/in", lake / "a/out/sub/link")
    assert ds.holds_objects(out)


def test_store_keys_through_links_are_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"B's")
    os.symlink(outside, tmp_path / "store/linked")
    os.symlink(outside / "secret", tmp_path / "store/file-link")
    for key in ("linked/secret", "linked/new", "file-link"):
        with pytest.raises(localfs.UnsafePath, match="symbolic link"):
            store.open(key)
        with pytest.raises(localfs.UnsafePath, match="symbolic link"):
            store.size(key)
    with pytest.raises(localfs.UnsafePath, match="linked is a symbolic link"):
        store.put_bytes("linked/new", b"x")
    assert not (outside / "new").exists()
    with pytest.raises(localfs.UnsafePath, match="symbolic link"):
        store.delete("linked/secret")
    assert (outside / "secret").read_bytes() == b"B's"
    for bad in ("../outside/secret", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(ValueError):
            store.open(bad)
    # A write at a key that is a link replaces the link, never its target.
    store.put_bytes("file-link", b"mine")
    assert (outside / "secret").read_bytes() == b"B's"
    assert store.get_bytes("file-link") == b"mine"
    store.put_bytes("d/k", b"1")
    os.mkfifo(tmp_path / "store/d/fifo")
    assert store.list("") == ["d/k", "file-link"]  # no links, no FIFOs, not walked into
    got = within_seconds(lambda: store.open("d/fifo"))
    assert isinstance(got, localfs.UnsafePath) and "is a FIFO" in str(got), got
    with pytest.raises(ObjectNotFound):
        store.open("d/k/under-a-file")


def test_output_files_are_readable_by_the_team_and_the_services_are_not(
        tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        out = ds.destination(ds.parse(f"file://{tmp_path}/out/run-1/"))
        out.put_bytes("part-000000.parquet", b"x")
        own = LocalStore(tmp_path / "service")
        own.put_bytes("files/f", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "out/run-1/part-000000.parquet").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "out/run-1").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tmp_path / "service/files/f").st_mode) == 0o600
    # An output prefix through a link (put there after the batch resolved it) is refused.
    os.symlink(tmp_path / "out", tmp_path / "outlink")
    with pytest.raises(localfs.UnsafePath, match="symbolic link"):
        ds.destination(ds.parse(f"file://{tmp_path}/outlink/run-2/"))
    assert not (tmp_path / "out/run-2").exists()
