"""SIGINT/SIGTERM during training: finish the current step, save a checkpoint, exit."""
from __future__ import annotations

import signal
import time
from typing import Optional


class StopFlag:
    """Turns SIGINT/SIGTERM into a request to stop at the next step boundary."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self.since = 0.0  # time.monotonic() of the first signal
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        # torchrun forwards Ctrl-C / scancel to workers that got it too: a repeat within 2 s is the same request
        if self.signal is not None and time.monotonic() - self.since > 2.0:  # second signal: stop now
            raise KeyboardInterrupt
        if self.signal is None:
            self.signal, self.since = signum, time.monotonic()

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
