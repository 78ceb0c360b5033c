"""What every shard attempt shares, chunked or row by row: the lease (renewed while it
runs, fencing every checkpoint), the usage record of a commit, the unfenced work
accounting, and the release that ends the attempt.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from jobs.batches import queries as repo
from jobs.batches.outputs import Tokens
from jobs.core.context import Context
from jobs.core.lanes import lane_for
from jobs.core.status import ShardOutcome, ShardStatus
from jobs.tenants import usage

log = logging.getLogger("inferq.pipeline")


class ServerFaults(RuntimeError):
    """Lines of chunk ``chunk`` failed on the server's side: compute the chunk again."""

    def __init__(self, chunk: int, faults: list[str]) -> None:
        super().__init__(f"chunk {chunk}: {len(faults)} requests failed on the server's side "
                         f"and will be computed again (the first: {faults[0]})")


@dataclass
class ShardResult:
    outcome: ShardOutcome
    finalize: bool = False
    retry_in_s: float = 0.0


class LeaseKeeper(threading.Thread):
    """Renews the shard's lease while a chunk runs, however long it takes; a kill -9
    stops the renewals, so the janitor hands the shard on within one lease."""

    def __init__(self, ctx: Context, shard_id: str, token: str) -> None:
        super().__init__(name="inferq-lease", daemon=True)
        self.ctx, self.shard_id, self.token = ctx, shard_id, token
        self.done = threading.Event()
        self.lost = False

    def run(self) -> None:
        ttl = self.ctx.settings.lease_seconds
        while not self.done.wait(ttl / 3):
            try:
                with self.ctx.db.session() as s:
                    if not repo.renew_lease(s, self.shard_id, self.token, ttl):
                        self.lost = True
                        return
            except Exception as e:  # noqa: BLE001 - a missed renewal is retried next tick
                log.warning("shard %s: lease renewal failed: %s", self.shard_id, e)


@dataclass(frozen=True)
class Payer:
    """Whom a shard's usage is billed to, and as what."""

    tenant_id: str
    api_key_id: str | None
    kind: str
    model: str
    service_tier: str

    def bill(self, ctx: Context, shard_id: str, batch_id: str, chunk: int, completed: int,
             tokens: Tokens, seconds: float) -> usage.Entry | None:
        """The usage record of a committed chunk: its ok lines (None when it has none)."""
        if completed == 0:
            return None
        lane = lane_for(self.service_tier)
        return usage.entry(ctx.settings, source=f"chunk:{shard_id}:{chunk}",
                           tenant_id=self.tenant_id, api_key_id=self.api_key_id,
                           kind=self.kind, model=self.model, lane=lane,
                           service_tier=self.service_tier, batch_id=batch_id,
                           num_requests=completed, input_tokens=tokens.prompt,
                           output_tokens=tokens.completion, accelerator_seconds=seconds)


def count_rows(ctx: Context, shard_id: str, started: int, computed: int) -> None:
    """Rows handed to the engine and rows whose results were produced (counted before
    they are committed), on the shard row: beyond its size, redone work."""
    try:
        with ctx.db.session() as s:
            repo.count_rows(s, shard_id, started, computed)
    except Exception as e:  # noqa: BLE001 - accounting never stops the work
        log.warning("shard %s: counting rows failed: %s", shard_id, e)


def release(ctx: Context, batch_id: str, shard_id: str, token: str, status: ShardStatus,
             outcome: ShardOutcome, error: str | None = None, not_its_fault: bool = False
             ) -> ShardResult:
    """Give up the lease; the last shard of a batch to finish asks for finalize."""
    with ctx.db.session() as s:
        repo.get_batch(s, None, batch_id, lock=True)  # serialises "am I the last?" per batch
        if not repo.release_shard(s, shard_id, token, status, error, not_its_fault):
            return ShardResult(ShardOutcome.FENCED)
        last = status != ShardStatus.QUEUED and repo.unfinished_shards(s, batch_id) == 0
    return ShardResult(outcome, finalize=last)
