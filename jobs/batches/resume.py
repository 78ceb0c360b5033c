"""Where a generation shard's unfinished rows resume: the tokens they had generated.

Each commit of a generation shard (workers/shards/rows.py) also writes, beside the
chunk's parts, the tokens generated so far by each of its rows that is still running
and can be continued (``GenRequest.resumable``), and those of rows it was given to
resume and has not started again. The next attempt reads what the last committed chunk
wrote (the attempt that committed it, so a fenced-off writer is never read) and
continues each such row after those tokens: an interruption loses at most the
seconds since that commit, not each row's whole answer. A prefix of a greedy answer
continues into that answer; an unseeded sample's prefix into a sample all the same.

Written as gzipped JSON ``{"rows": {"<position>": [token, ...]}}``; a chunk whose rows
had nothing to resume writes none.
"""

from __future__ import annotations

import gzip
import logging

import orjson

from jobs.batches import queries as repo
from jobs.core.schema import Shard
from storage import keys
from storage.objects import ObjectNotFound, ObjectStore

log = logging.getLogger("inferq.pipeline")

Tokens = dict[int, list[int]]  # a row's position -> the tokens it had generated


def load(store: ObjectStore, sh: Shard) -> Tokens:
    """The tokens the shard's last committed chunk left its unfinished rows with."""
    return at(store, sh, sh.chunks_done - 1)


def at(store: ObjectStore, sh: Shard, chunk: int) -> Tokens:
    """The tokens the shard's unfinished rows had when ``chunk`` was committed."""
    attempt = repo.part_attempt(sh, chunk) if 0 <= chunk < sh.chunks_done else None
    if attempt is None:
        return {}
    key = keys.resume_tokens(sh.batch_id, sh.index, chunk, attempt)
    try:
        data = orjson.loads(gzip.decompress(store.get_bytes(key)))
    except ObjectNotFound:
        return {}
    except (OSError, EOFError, orjson.JSONDecodeError) as e:  # rows start over: correct
        log.warning("shard %s: unreadable resume tokens %s (%s); its rows start over",
                    sh.id, key, e)
        return {}
    return {int(i): [int(t) for t in ids] for i, ids in data["rows"].items() if ids}


def save(store: ObjectStore, batch_id: str, shard_index: int, chunk: int, attempt: int,
         rows: Tokens) -> None:
    """Write ``rows`` for ``chunk``, before its checkpoint commits it (none if empty)."""
    if not rows:
        return
    body = orjson.dumps({"rows": {str(i): ids for i, ids in sorted(rows.items())}})
    store.put_bytes(keys.resume_tokens(batch_id, shard_index, chunk, attempt),
                    gzip.compress(body, compresslevel=1))
