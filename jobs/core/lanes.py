"""The lanes work travels on, the service tiers a batch or job asks for, and which lane
serves which tier: the one place these names and their order are kept."""

from __future__ import annotations

REALTIME, JOBS, BATCH, FLEX, CONTROL = "realtime", "jobs", "batch", "flex", "control"
# The lanes that run a model, in their priority order: an engine serves a realtime
# request before a job, a job before a batch row, a batch row before a flex one; health
# and the dashboard report them in this order.
MODEL_LANES = (REALTIME, JOBS, BATCH, FLEX)
# Each model lane's priority in an engine (lower is served first): its place in that order.
PRIORITY = {lane: i for i, lane in enumerate(MODEL_LANES)}
# The lanes of batch shards, one Celery queue each: standard batches and flex.
SHARD_LANES = (BATCH, FLEX)
# Every lane, as the dashboard orders them.
ALL_LANES = (*MODEL_LANES, CONTROL)
# The lanes whose work Celery carries (realtime requests and jobs are Redis lists).
CELERY_LANES = (CONTROL, BATCH, FLEX)

DEFAULT_TIER, FLEX_TIER = "default", "flex"


def tier_of(requested: str | None) -> str:
    """The service tier a request's ``service_tier`` gets: flex, or the default."""
    return FLEX_TIER if requested == FLEX_TIER else DEFAULT_TIER


def lane_for(tier: str) -> str:
    """The shard lane (and queue) of a batch's service tier."""
    return FLEX if tier == FLEX_TIER else BATCH


def tier_for(lane: str) -> str:
    """A service tier whose shards go to ``lane``."""
    return FLEX_TIER if lane == FLEX else DEFAULT_TIER
