"""What the lanes ask of a generation engine, whichever runs the version."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only (workers.models.chat is torch-bound)
    from workers.engines.request import GenRequest
    from workers.engines.sinks import Sink
    from workers.engines.stats import GenStats
    from workers.models.chat import ChatTokens


class Engine(Protocol):
    """A generation engine: requests in with a priority (0 realtime first), output out
    through each request's sink (``workers.engines.sinks.Sink``) on the engine's thread."""

    name: str  # "transformers" | "vllm", reported in the heartbeat and /v1/models
    max_rows: int  # sequences it runs at once, realtime included
    stats: GenStats

    @property
    def model(self) -> ChatTokens:
        """What requests are built with (``build_request``)."""
        ...

    def submit(self, req: GenRequest, sink: Sink, priority: int) -> None: ...

    def load(self) -> tuple[int, int]:
        """(running, waiting) sequences."""
        ...

    def stop(self) -> None:
        """Stop; what was submitted and not finished fails ("the engine stopped")."""
        ...
