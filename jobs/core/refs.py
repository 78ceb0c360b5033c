"""Identifiers made of others, built and taken apart here only: a model version's
``name@version`` and a shard's ``<batch id>.<index>``."""

from __future__ import annotations


def model_ref(name: str, version: str | None) -> str:
    """A model version's id in queues, heartbeats and placement: ``name@version`` (the
    bare name when the version is not known, as a worker announcing names only)."""
    return f"{name}@{version}" if version else name


def split_ref(ref: str) -> tuple[str, str | None]:
    """``name@version`` -> (name, version); a bare name -> (name, None). Names and
    versions never hold '@'."""
    name, _, version = ref.rpartition("@")
    return (name, version) if name else (ref, None)


def shard_id(batch_id: str, index: int) -> str:
    """A shard's id: its batch's and its index (zero-padded, so ids sort in order)."""
    return f"{batch_id}.{index:06d}"


def batch_of(shard: str) -> str:
    """The batch a shard id belongs to."""
    return shard.rsplit(".", 1)[0]
