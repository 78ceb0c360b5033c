"""How ``inferq up`` reacts to SIGTERM and SIGINT (Ctrl-C) while its stack starts and
while it runs."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived while the stack was starting (see :class:`StopSignals`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """How ``inferq up`` reacts to SIGTERM and SIGINT (Ctrl-C); installed before the
    stack starts. While ``raising``, the first signal raises :class:`Interrupted` in the
    start in progress, which unwinds to the caller's cleanup (``Stack.stop``); inside
    :meth:`held` (a process being started and recorded) it waits for the block's end,
    so ``stop`` finds every process started. Once the stack is up the caller turns
    ``raising`` off and polls ``received``. Later signals are only recorded."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.raising = True
        self._held = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            self._raise_if_due()

    def _raise_if_due(self) -> None:
        if self.received is not None and self.raising and not self._held:
            self.raising = False
            raise Interrupted(self.received)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        self._raise_if_due()
