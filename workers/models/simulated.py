"""The simulated accelerator: a model whose forward pass is a cost model of a device.

Selected with ``INFERQ_ACCELERATOR=simulated``; the cost model is the profile that
``INFERQ_SIMULATED_PROFILE`` names (``PROFILES``, read from
``simulated_profiles.toml`` beside this module). Everything around the forward pass is
the real worker: the registry row, the model's own tokenizer (its tokenizer files
only, never the weights), request checks, the embedding engine and its micro-batches,
the lanes, shard leases and checkpoints. Only ``embed`` differs: it sleeps for what
the profile says one pass over that micro-batch costs (a fixed cost per pass plus a
cost per padded token) and returns, for each row, a unit vector derived from a hash of
its token ids, of the real model's size (its ``config.json``'s ``hidden_size``). The
same ids always give the same vector, on any worker.

Sleeping, not computing: a simulated worker spends almost no CPU on the model, so
many of them share a small machine, and what a benchmark of a simulated fleet
measures is the rest of the service (queues, database, object store, the workers'
own CPU). A simulated worker serves embeddings only: it announces no chat model.

No torch: nothing this module imports loads it (the tokenizer classes are loaded as
``workers.models.token_count`` does), so a simulated worker process never has torch.
"""

from __future__ import annotations

import hashlib
import json
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from jobs.fleet import registry
from jobs.fleet.registry import EMBEDDINGS_KIND
from workers.models.embedding_inputs import EmbeddingInputs
from workers.models.token_count import load_tokenizer

if TYPE_CHECKING:
    from jobs.core.context import Context
    from jobs.core.schema import Model
    from jobs.core.settings import Settings

ACCELERATOR = "simulated"  # what heartbeats and logs call a simulated worker's device


@dataclass(frozen=True)
class Profile:
    """The cost model of one device running one model.

    Embeddings: a forward pass over a micro-batch of ``rows`` rows padded to ``width``
    tokens costs ``embed_pass_ms`` + ``embed_token_us`` x rows x width. Generation
    (recorded for the chat model of the same device; a simulated worker serves no chat
    model): a decode step costs ``decode_step_ms`` + ``decode_row_us`` x running rows,
    and a prefill ``prefill_token_us`` per prompt token."""

    name: str
    device: str
    embedding_model: str
    embed_pass_ms: float
    embed_token_us: float
    chat_model: str
    decode_step_ms: float
    decode_row_us: float
    prefill_token_us: float
    source: str  # where the numbers come from
    # Loading a model version (a cold start): a fixed cost plus its bytes at this rate.
    load_s: float = 0.5
    load_mb_per_s: float = 1000.0

    def load_seconds(self, size_bytes: int) -> float:
        """What loading a model version of ``size_bytes`` costs (reading its files and
        moving them to the device)."""
        return self.load_s + size_bytes / (self.load_mb_per_s * 1e6)

    def embed_seconds(self, rows: int, width: int) -> float:
        """What one forward pass over ``rows`` rows padded to ``width`` tokens costs."""
        return (self.embed_pass_ms / 1e3) + self.embed_token_us * rows * width / 1e6

    def decode_seconds(self, rows: int) -> float:
        """What one decode step over ``rows`` running sequences costs."""
        return self.decode_step_ms / 1e3 + self.decode_row_us * rows / 1e6

    def prefill_seconds(self, tokens: int) -> float:
        """What a prefill of ``tokens`` prompt tokens (padding included) costs."""
        return self.prefill_token_us * tokens / 1e6

    def describe(self) -> dict[str, Any]:
        return asdict(self)


# The profiles, by name: data with the sources of their numbers, in a file of their own.
PROFILES: dict[str, Profile] = {
    name: Profile(name=name, **row) for name, row in tomllib.loads(
        (Path(__file__).with_name("simulated_profiles.toml")).read_text()).items()}


def profile(name: str) -> Profile:
    """The profile called ``name``; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown simulated accelerator profile {name!r}: "
                         f"pick one of {', '.join(sorted(PROFILES))}") from None


def unit_vector(ids: list[int], dim: int) -> np.ndarray:
    """A float32 unit vector of ``dim`` components determined by the token ids alone."""
    digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16)
    rng = np.random.default_rng(int.from_bytes(digest.digest(), "little"))
    v = rng.standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class SimulatedEmbeddingModel(EmbeddingInputs):
    """An embedding model on the simulated accelerator: the real model's name, context,
    size, vocabulary and tokenizer; a forward pass that sleeps for the profile's cost.

    ``sleep``: how the cost is spent (``time.sleep``; tests pass a recorder)."""

    accelerator = ACCELERATOR

    def __init__(self, model_id: str, tokenizer: Any, max_length: int, dim: int,
                 vocab_size: int, profile: Profile, fault_oom_above_tokens: int = 0,
                 fault_fail: bool = False, sleep: Any = time.sleep) -> None:
        self.model_id, self.tokenizer = model_id, tokenizer
        self.max_length, self.dim, self.vocab_size = max_length, dim, vocab_size
        self.profile = profile
        self.fault_oom_above_tokens = fault_oom_above_tokens  # as the real model's
        self.fault_fail = fault_fail
        self.sleep = sleep

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        """One simulated forward pass over a micro-batch; rows are unit float32 vectors."""
        width = max(len(x) for x in batch)
        if self.fault_fail:
            raise RuntimeError("injected: the model failed")
        if self.fault_oom_above_tokens and len(batch) * width > self.fault_oom_above_tokens:
            raise MemoryError(f"injected: {len(batch)} x {width} tokens is over "
                              f"{self.fault_oom_above_tokens}")
        self.sleep(self.profile.embed_seconds(len(batch), width))
        return np.stack([unit_vector(ids, self.dim) for ids in batch])


def load_version(settings: Settings, ctx: Context, m: Model,
                 sleep: Any = time.sleep) -> SimulatedEmbeddingModel:
    """An embedding model version on the simulated accelerator, as its registry row
    describes it: its tokenizer files are fetched (never its weights), its size and
    vocabulary read from its ``config.json``, and the load costs what the profile says
    for its bytes."""
    prof = profile(settings.simulated_profile)
    if m.kind != EMBEDDINGS_KIND:
        raise ValueError(f"{m.name} is a {m.kind} model, not {EMBEDDINGS_KIND}")
    from workers.models import cache

    sleep(prof.load_seconds(registry.total_bytes(m)))
    return from_directory(m.name, cache.tokenizer_dir(ctx, m), m.context_length, prof,
                          fault_oom_above_tokens=settings.fault_oom_above_tokens,
                          fault_fail=settings.fault_model_fails)


def from_directory(model_id: str, path: Path, max_length: int, prof: Profile,
                   **faults: Any) -> SimulatedEmbeddingModel:
    """A simulated ``model_id`` from a directory holding its tokenizer files and its
    ``config.json`` (size and vocabulary); ``faults``: as the real model's."""
    config = json.loads((path / "config.json").read_text())
    tok = load_tokenizer(path)  # this model's own instance, as the real model has
    return SimulatedEmbeddingModel(
        model_id, tok, max_length=max_length, dim=int(config["hidden_size"]),
        vocab_size=int(config.get("vocab_size", len(tok))), profile=prof, **faults)
