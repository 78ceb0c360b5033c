"""What a generation shard's commit saves of its unfinished rows (jobs/batches/resume.py)
is read back by the next attempt from the part the checkpoint committed: never a
fenced-off attempt's file of the same part, nothing before the first commit, and an
unreadable file makes its rows start over rather than fail the shard."""

from __future__ import annotations

from pathlib import Path

from jobs.batches import resume
from jobs.core.schema import Shard
from storage import keys
from storage.objects import LocalStore


def shard(chunks_done: int, attempts: dict[str, int]) -> Shard:
    return Shard(id="s", batch_id="b", index=3, chunks_done=chunks_done,
                 part_attempts=attempts)


def test_the_last_committed_part_is_what_rows_resume_from(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert resume.load(store, shard(0, {})) == {}  # nothing committed yet
    resume.save(store, "b", 3, 0, 1, {5: [10, 11], 2: [7]})
    resume.save(store, "b", 3, 1, 2, {5: [10, 11, 12]})
    resume.save(store, "b", 3, 1, 3, {5: [99]})  # a fenced-off attempt's late write
    resume.save(store, "b", 3, 2, 2, {})  # nothing left to resume: no file
    sh = shard(2, {"0": 1, "1": 2})
    assert resume.load(store, sh) == {5: [10, 11, 12]}
    assert resume.at(store, sh, 0) == {2: [7], 5: [10, 11]}
    assert resume.at(store, sh, 2) == {}  # not committed
    assert resume.load(store, shard(3, {"0": 1, "1": 2, "2": 2})) == {}
    assert not store.exists(keys.resume_tokens("b", 3, 2, 2))


def test_an_unreadable_file_starts_its_rows_over(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes(keys.resume_tokens("b", 3, 0, 1), b"not gzip")
    assert resume.load(store, shard(1, {"0": 1})) == {}
