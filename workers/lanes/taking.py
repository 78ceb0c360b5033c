"""How the realtime lane takes requests: reliably (``jobs.realtime.taken``). A request
moves from its queue into this worker's taken list in one step and leaves it when it
is answered; this worker's lease is renewed each second, and the taken lists of
workers whose lease lapsed are emptied (``taken.reap``).

Redis has no blocking move from several lists, so a take that finds nothing waits on
one of the queues (a blocking move from it, the queue changing at each wait) for
``WAIT_S`` and then looks at them all again: a request on the queue waited on is taken
as it arrives, one on another within ``WAIT_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, cast

import redis

from jobs.core import redis_keys
from jobs.realtime import taken
from workers.lanes.streams import Publisher, PubSink

log = logging.getLogger("inferq.realtime")

WAIT_S = 0.02  # with several queues: how long one wait lasts before all are looked at


def as_bytes(raw: bytes | str) -> bytes:
    """A message as Redis holds it."""
    return raw.encode() if isinstance(raw, str) else raw


class Taker(threading.Thread):
    """This worker's taken requests (``name``: as its lease and taken list are named),
    and those not answered yet (``held``: request id -> the message as taken; ``sinks``:
    the streams among them); its thread renews the lease and reaps the gone workers'
    requests. A stream's bookkeeping follows its last event on ``publisher``."""

    def __init__(self, r: redis.Redis, name: str, publisher: Publisher | None = None) -> None:
        super().__init__(name="inferq-realtime-lease", daemon=True)
        self.r, self.name, self.publisher = r, name, publisher
        self.held: dict[str, bytes] = {}
        self.sinks: dict[str, PubSink] = {}
        self.key = redis_keys.realtime_taken(name)
        self.started_key = redis_keys.realtime_started(name)
        self._take = r.register_script(taken.TAKE)
        self._start = r.register_script(taken.START)
        self._give_back = r.register_script(taken.GIVE_BACK)
        self.stopping = threading.Event()
        self._turn = 0
        self.renew()  # before the first take

    # The lane's thread ---------------------------------------------------------------

    def take(self, queues: list[str], timeout: float, most: int = 1
             ) -> tuple[str, list[bytes]] | None:
        """Up to ``most`` requests (messages as pushed) of the first of ``queues`` that
        holds one, moved to the taken list; None when none came within about
        ``timeout``."""
        if (got := self.take_now(queues, most)) is not None:
            return got
        self._turn += 1
        queue = queues[self._turn % len(queues)]
        wait = timeout if len(queues) == 1 else min(timeout, WAIT_S)
        raw = self.r.blmove(queue, self.key, cast(int, wait), "RIGHT", "LEFT")  # seconds
        if raw is not None:
            rest = self.take_now([queue], most - 1) if most > 1 else None
            return queue, [as_bytes(raw), *(rest[1] if rest else [])]
        return None  # the next take looks at them all first

    def take_now(self, queues: list[str], most: int = 1) -> tuple[str, list[bytes]] | None:
        """``take`` without waiting."""
        if not queues or most < 1:
            return None
        got = self._take(keys=[self.key, *queues], args=[most])
        if not got:
            return None
        return (got[0].decode() if isinstance(got[0], bytes) else got[0],
                [bytes(x) for x in got[1:]])

    def start_work(self, rid: str) -> bool:
        """Mark a held request started (its engine gets it now); False when it is no
        longer this worker's: the reaper gave it to another (this worker's lease had
        lapsed), which answers it (it is no longer held here)."""
        raw = self.held.get(rid)
        if raw is None or self._start(keys=[self.key, self.started_key], args=[raw, rid]):
            return True
        self.sinks.pop(rid, None)
        self.held.pop(rid, None)
        return False

    def hold(self, msg: Any, raw: bytes) -> None:
        """A taken message, until it is answered; one nobody can be answered for (no
        id, or a copy of one held) is forgotten at once."""
        rid = msg.get("id") if isinstance(msg, dict) else None
        if isinstance(rid, str) and rid not in self.held:
            self.held[rid] = raw
        else:
            self.forget(raw, "")

    def answered(self, rid: str, pipe: Any = None) -> None:
        """Request ``rid`` was answered or ended: no longer held (in ``pipe`` if given)."""
        self.sinks.pop(rid, None)
        raw = self.held.pop(rid, None)
        if raw is not None:
            self.forget(raw, rid, pipe)

    def stream_ended(self, rid: str) -> None:
        """A stream's last event is out (queued on the publisher): once it is sent, the
        request is no longer held."""
        self.sinks.pop(rid, None)
        raw = self.held.pop(rid, None)
        if raw is not None and self.publisher is not None:
            self.publisher.then(lambda p: self.forget(raw, rid, p))
        elif raw is not None:
            self.forget(raw, rid)

    def wait_answered(self, by: float) -> list[str]:
        """Wait until every held request is answered, or the monotonic time ``by``; the
        ids of those still held then."""
        if self.held:
            log.info("realtime lane stopping: %d requests to answer within %.0f s",
                     len(self.held), max(0.0, by - time.monotonic()))
        while self.held and time.monotonic() < by:
            time.sleep(0.05)
        return list(self.held)

    def give_back(self, queue: str, raw: bytes) -> bool:
        """To the head of its queue, for another worker."""
        return bool(self._give_back(keys=[self.key, queue], args=[raw]))

    def forget(self, raw: bytes | None, rid: str, pipe: Any = None) -> None:
        """The request was answered or ended: out of the taken list (in ``pipe``, if
        given, else now)."""
        if raw is None:
            return
        p = pipe if pipe is not None else self.r.pipeline(transaction=False)
        p.execute_command("LREM", self.key, 1, raw)
        p.srem(self.started_key, rid)
        if pipe is None:
            p.execute()

    # The lease's thread --------------------------------------------------------------

    def renew(self) -> None:
        with self.r.pipeline(transaction=False) as p:
            p.set(redis_keys.realtime_lease(self.name), b"1", px=int(taken.LEASE_TTL_S * 1000))
            p.sadd(redis_keys.REALTIME_TAKERS, self.name)
            p.execute()

    def run(self) -> None:
        while not self.stopping.wait(taken.LEASE_EVERY_S):
            try:
                self.renew()
                taken.reap(self.r)
            except redis.RedisError as e:
                log.warning("realtime lease: %s", e)
            except Exception:  # noqa: BLE001 - the lease must outlive any error
                log.exception("realtime lease")

    def close(self) -> None:
        """This worker's lane stops: what it still holds goes to others (a request not
        started is given back; a started one ends with ``worker_gone``), and its lease
        ends."""
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=5)
        try:
            left = taken.empty(self.r, self.name)
            if any(left):
                log.info("realtime lane stopping: %d requests given back, %d ended, %d "
                         "dropped", *left)
            with self.r.pipeline() as p:
                p.delete(redis_keys.realtime_lease(self.name), self.started_key)
                p.srem(redis_keys.REALTIME_TAKERS, self.name)
                p.execute()
        except redis.RedisError as e:  # the reaper does it once the lease lapses
            log.warning("realtime lane stopping: %s", e)
