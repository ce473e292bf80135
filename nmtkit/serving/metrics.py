"""The server's counters for ``GET /metrics``, in Prometheus's text exposition format.

Requests answered, lines translated, failed requests, refusals by reason, requests whose
client left before the answer, the lines and requests of every translator call (histograms)
and the latency of answered requests (a histogram). Updated from the event loop and the
batcher's thread, so every update and every read holds one lock: a scrape sees a consistent
set, and no increment is lost.
"""
from __future__ import annotations

import threading
from typing import Sequence

from nmtkit.serving.requests import REASONS

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    """Cumulative buckets (``le``), sum and count of the values observed."""

    def __init__(self, name: str, help_text: str, bounds: Sequence[float]) -> None:
        self.name, self.help_text, self.bounds = name, help_text, tuple(bounds)
        self.buckets = [0] * len(self.bounds)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[index] += 1
        self.sum += value
        self.count += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        out += [f'{self.name}_bucket{{le="{bound:g}"}} {count}' for bound, count in zip(self.bounds, self.buckets)]
        out += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.sum!r}",
                f"{self.name}_count {self.count}"]
        return out


class Metrics:
    """Everything ``/metrics`` reports; every method may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = self.lines = self.failed = self.gone = 0
        self.rejected = {reason: 0 for reason in REASONS}
        self.latency = Histogram("nmtkit_request_latency_seconds",
                                 "Time from a translate request's arrival to its answer, answered requests only.",
                                 LATENCY_BUCKETS)
        self.batch_lines = Histogram("nmtkit_batch_lines", "Lines per translator call.", SIZE_BUCKETS)
        self.batch_requests = Histogram("nmtkit_batch_requests", "Requests sharing one translator call.",
                                        SIZE_BUCKETS)

    def answered(self, lines: int, seconds: float) -> None:
        with self._lock:
            self.requests += 1
            self.lines += lines
            self.latency.observe(seconds)

    def failed_request(self) -> None:
        with self._lock:
            self.failed += 1

    def disconnected(self) -> None:
        with self._lock:
            self.gone += 1

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def batch(self, requests: int, lines: int) -> None:
        with self._lock:
            self.batch_requests.observe(requests)
            self.batch_lines.observe(lines)

    def text(self, queued: int) -> str:
        """The exposition: ``# HELP`` and ``# TYPE`` before each metric, one sample a line."""
        with self._lock:
            out = counter("nmtkit_requests_total", "Translate requests answered with 200.", self.requests)
            out += counter("nmtkit_lines_total", "Lines translated in answered requests.", self.lines)
            out += counter("nmtkit_failed_requests_total", "Translate requests answered with 500.", self.failed)
            out += counter("nmtkit_disconnected_requests_total", "Translate requests whose client left before the "
                           "answer (their translation dropped or stopped).", self.gone)
            out += ["# HELP nmtkit_rejected_requests_total Requests refused with a 4xx, 503 or 504, by reason.",
                    "# TYPE nmtkit_rejected_requests_total counter"]
            out += [f'nmtkit_rejected_requests_total{{reason="{reason}"}} {count}'
                    for reason, count in sorted(self.rejected.items())]
            out += ["# HELP nmtkit_queued_requests Requests waiting for the translator.",
                    "# TYPE nmtkit_queued_requests gauge", f"nmtkit_queued_requests {queued}"]
            out += self.latency.lines() + self.batch_lines.lines() + self.batch_requests.lines()
        return "\n".join(out) + "\n"


def counter(name: str, help_text: str, value: int) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
