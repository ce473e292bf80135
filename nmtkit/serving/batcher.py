"""One worker thread owns the engine; requests that arrive together share its calls.

The worker takes the first waiting request, then keeps collecting for a short window
after that request arrived (no wait at all when requests are already queued behind a busy
model) until the token budget is spent. Requests with the same decode settings (target
language included: one tag per call) become one ``Translator.hypotheses`` call (the engine
under those settings: ``engine.with_options``); each request gets back exactly its own lines,
in order. Requests join only while their joint ``SearchShape`` (``admission.py``) stays within
the memory bound, so joining never makes a search call that no request alone was allowed.
Only the worker touches the model, so a torch model never runs two calls at once.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Optional

from nmtkit.decoding.guides import Guide
from nmtkit.decoding.options import TranslateOptions
from nmtkit.decoding.hypothesis import Hypothesis
from nmtkit.decoding.translate import Translator
from nmtkit.serving.admission import SearchShape
from nmtkit.serving.metrics import Metrics

_STOP = object()  # queued by close(): the worker finishes what it holds, then returns


@dataclass
class Job:
    texts: list[str]
    decode: dict[str, Any]  # settings for this request; the server's options give the rest
    guides: Optional[list[Guide]] = None  # a prefix and constraints per text, if the request has them
    shape: Optional[SearchShape] = None  # the request as one search call (admission.admit); None: unchecked
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)

    def key(self) -> tuple:
        return tuple(sorted(self.decode.items()))


class Batcher:
    """``submit`` from any thread; the worker thread answers each job's future with a
    JSON-ready dict (``answer``) or the exception its translation raised. ``engine`` is a
    loaded engine (``nmtkit.translate_files.open_engine``), ``base`` the server's options;
    jobs join while their shapes' joint estimate is at most ``max_search_bytes`` (None: no
    bound); every translator call is counted in ``metrics``."""

    def __init__(self, engine, base: TranslateOptions, window_s: float, budget_tokens: int,
                 metrics: Optional[Metrics] = None, max_search_bytes: Optional[int] = None) -> None:
        self.engine, self.base, self.metrics = engine, base, metrics or Metrics()
        self.max_search_bytes = max_search_bytes
        self.window_s, self.budget_tokens = window_s, budget_tokens
        self._queue: queue.Queue = queue.Queue()
        self._held: Optional[object] = None  # a job taken that did not fit the budget, or _STOP
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "lines": 0, "batches": 0, "largest_batch_requests": 0, "failed_batches": 0,
                       "truncated_lines": 0}
        self._thread = threading.Thread(target=self._work, name="nmtkit-translator", daemon=True)
        self._thread.start()

    def submit(self, texts: list[str], decode: dict[str, Any], guides: Optional[list[Guide]] = None,
               shape: Optional[SearchShape] = None) -> Future:
        # a setting equal to the server's own changes nothing: such requests share batches with those without it
        decode = {name: value for name, value in decode.items() if value != getattr(self.base, name)}
        job = Job(texts, decode, guides, shape)
        self._queue.put(job)
        return job.future

    def stats(self) -> dict[str, int]:
        """Counters since start: ``batches`` counts translator calls, so fewer batches than
        requests means requests were batched together."""
        with self._lock:
            return {**self._stats, "queued": self._queue.qsize()}

    def close(self) -> None:
        """Finish every job already submitted, then stop the worker."""
        self._queue.put(_STOP)
        self._thread.join()

    def _work(self) -> None:
        while True:
            jobs = self._collect()
            if jobs is None:
                return
            groups: dict[tuple, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.key(), []).append(job)
            for group in groups.values():
                self._translate(group)

    def _next(self, timeout: Optional[float]) -> object:
        """The held job or the next queued one (raises queue.Empty after ``timeout``)."""
        if self._held is not None:
            item, self._held = self._held, None
            return item
        return self._queue.get(timeout=timeout)

    def _collect(self) -> Optional[list[Job]]:
        """The next jobs to run together, or None once stopped. Jobs whose client gave up
        (a cancelled future) are dropped."""
        jobs: list[Job] = []
        cost, deadline, joint = 0, None, SearchShape()
        while deadline is None or cost < self.budget_tokens:
            try:
                item = self._next(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is _STOP:
                if jobs:
                    self._held = item
                return jobs or None
            job_cost = self._cost(item)
            joined = joint.joined(item.shape) if item.shape is not None else joint
            if jobs and (cost + job_cost > self.budget_tokens or not self._fits(joined)):
                self._held = item
                break
            if not item.future.set_running_or_notify_cancel():
                continue
            jobs.append(item)
            cost, joint = cost + job_cost, joined
            deadline = jobs[0].arrived + self.window_s
        return jobs

    def _fits(self, shape: SearchShape) -> bool:
        return self.max_search_bytes is None or shape.bytes(self.engine) <= self.max_search_bytes

    def _cost(self, job: Job) -> int:
        """Source pieces x beam, as the translator's own token budget counts them."""
        pieces = sum(len(ids) for ids in self.engine.src_vocab.encode_batch(job.texts))
        return max(pieces, 1) * job.decode.get("beam_size", self.base.beam_size)

    def _translate(self, group: list[Job]) -> None:
        """One translator call for jobs that share settings; each gets its own slice."""
        options = dataclasses.replace(self.base, **group[0].decode)
        texts = [text for job in group for text in job.texts]
        guides = [guide for job in group for guide in (job.guides or [Guide()] * len(job.texts))]
        try:
            translator = Translator(self.engine.with_options(options), options)
            sources, hypotheses = translator.hypotheses(texts, guides=guides if any(guides) else None)
        except Exception as err:  # a bug or an exhausted device: this batch fails, the server goes on
            with self._lock:
                self._stats["failed_batches"] += 1
            for job in group:
                job.future.set_exception(err)
            return
        with self._lock:  # counted before any answer leaves, so a client's next /health includes its request
            self._stats["truncated_lines"] += translator.truncated
            self._stats["requests"] += len(group)
            self._stats["lines"] += len(texts)
            self._stats["batches"] += 1
            self._stats["largest_batch_requests"] = max(self._stats["largest_batch_requests"], len(group))
        self.metrics.batch(len(group), len(texts))
        start = 0
        for job in group:
            end = start + len(job.texts)
            prefixes = [guide.prefix for guide in guides[start:end]]
            job.future.set_result(answer(translator, sources[start:end], hypotheses[start:end], prefixes))
            start = end


def answer(translator: Translator, sources: list[list[int]], hypotheses: list[list[Hypothesis]],
           prefixes: list[str]) -> dict[str, Any]:
    """The response body: best translations (each starting with its text's prefix), plus
    scores, alignments and n-best lists when the translator's options ask for them. An
    n-best list holds only the hypotheses the search found (an empty source has one), never
    the -inf padding rows that keep the text format at N lines per input: a JSON list
    carries its own length."""
    options, text = translator.options, translator.text
    out: dict[str, Any] = {"translations": [text(hyps[0], prefix) for hyps, prefix in zip(hypotheses, prefixes)]}
    if options.scores:
        out["scores"] = [hyps[0].score for hyps in hypotheses]
    if options.alignments:
        out["alignments"] = [translator.alignment(hyps[0], ids, prefix)
                             for ids, hyps, prefix in zip(sources, hypotheses, prefixes)]
    if options.nbest > 1:
        out["nbest"] = [[{"text": text(h, prefix), "score": h.score,
                          **({"alignment": translator.alignment(h, ids, prefix)} if options.alignments else {})}
                         for h in hyps] for ids, hyps, prefix in zip(sources, hypotheses, prefixes)]
    return out
