"""One worker thread owns the engine; requests that arrive together share its calls.

The worker takes the first waiting request, then keeps collecting for a short window
after that request arrived (no wait at all when requests are already queued behind a busy
model) until the token budget is spent. Requests with the same decode settings (target
language included: one tag per call) become one ``Translator.hypotheses`` call (the engine
under those settings: ``engine.with_options``); each request gets back exactly its own lines,
in order. Requests join only while their joint ``SearchShape`` (``admission.py``) stays within
the memory bound, so joining never makes a search call that no request alone was allowed.
Only the worker touches the model, so a torch model never runs two calls at once.

Nobody's work is done for nothing: at most ``max_queued`` requests wait (``submit`` raises
QueueFull beyond), a request whose client left or whose time ran out is ``abandon``-ed (dropped
if it waits, never counted as answered), and a call whose requests are all abandoned stops at
its next search call or, on a torch model, at its next decoder step (``Interrupted``).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from nmtkit.decoding.guides import Guide
from nmtkit.decoding.options import TranslateOptions
from nmtkit.decoding.hypothesis import Hypothesis
from nmtkit.decoding.translate import Translator
from nmtkit.serving.admission import SearchShape
from nmtkit.serving.metrics import Metrics

WAITING, RUNNING, DROPPED, DONE = "waiting", "running", "dropped", "done"


class QueueFull(Exception):
    """``max_queued`` requests already wait for the model."""


class Interrupted(Exception):
    """Every request of a call was abandoned, so its search stopped where it was."""


@dataclass(eq=False)
class Job:
    texts: list[str]
    decode: dict[str, Any]  # settings for this request; the server's options give the rest
    guides: Optional[list[Guide]] = None  # a prefix and constraints per text, if the request has them
    shape: Optional[SearchShape] = None  # the request as one search call (admission.admit); None: unchecked
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    state: str = WAITING  # changed under the batcher's lock only
    abandoned: bool = False  # nobody waits for the answer any more (read by the worker between steps)
    cost: Optional[int] = None  # source pieces x beam, worked out once by the worker

    def key(self) -> tuple:
        return tuple(sorted(self.decode.items()))


class Batcher:
    """``submit`` from any thread; the worker thread answers each job's future with a
    JSON-ready dict (``answer``) or the exception its translation raised. ``engine`` is a
    loaded engine (``nmtkit.translate_files.open_engine``), ``base`` the server's options;
    jobs join while their shapes' joint estimate is at most ``max_search_bytes`` (None: no
    bound); at most ``max_queued`` wait (None: no bound); every translator call is counted
    in ``metrics``."""

    def __init__(self, engine, base: TranslateOptions, window_s: float, budget_tokens: int,
                 metrics: Optional[Metrics] = None, max_search_bytes: Optional[int] = None,
                 max_queued: Optional[int] = None) -> None:
        self.engine, self.base, self.metrics = engine, base, metrics or Metrics()
        self.max_search_bytes, self.max_queued = max_search_bytes, max_queued
        self.window_s, self.budget_tokens = window_s, budget_tokens
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()  # in arrival order; the first may be looked at, not yet taken
        self._queued = 0  # jobs in WAITING state: in _waiting or collected for a call not yet started
        self._stopping = False
        self._stats = {"requests": 0, "lines": 0, "batches": 0, "largest_batch_requests": 0, "failed_batches": 0,
                       "truncated_lines": 0, "abandoned": 0}
        self._thread = threading.Thread(target=self._work, name="nmtkit-translator", daemon=True)
        self._thread.start()

    def submit(self, texts: list[str], decode: dict[str, Any], guides: Optional[list[Guide]] = None,
               shape: Optional[SearchShape] = None) -> Job:
        """A queued job (its ``future`` holds the answer); QueueFull when ``max_queued`` wait."""
        # a setting equal to the server's own changes nothing: such requests share batches with those without it
        decode = {name: value for name, value in decode.items() if value != getattr(self.base, name)}
        job = Job(texts, decode, guides, shape)
        with self._cond:
            if self.max_queued is not None and self._queued >= self.max_queued:
                raise QueueFull()
            self._waiting.append(job)
            self._queued += 1
            self._cond.notify()
        return job

    def abandon(self, job: Job) -> None:
        """Nobody waits for ``job`` any more: dropped if it has not started; a running call stops
        once every job in it is abandoned. Its future is left as it is (no one reads it)."""
        with self._cond:
            if job.abandoned or job.state == DONE:
                return
            job.abandoned = True
            self._stats["abandoned"] += 1
            if job.state == WAITING:
                self._drop(job)
                try:
                    self._waiting.remove(job)
                except ValueError:  # collected for a call that has not started: the worker skips it
                    pass

    def stats(self) -> dict[str, int]:
        """Counters since start: ``batches`` counts translator calls, so fewer batches than
        requests means requests were batched together; ``queued`` counts requests waiting for
        the model, those already collected for its next call too."""
        with self._cond:
            return {**self._stats, "queued": self._queued}

    def close(self, timeout: Optional[float] = None) -> bool:
        """Finish every job already submitted, then stop the worker; whether it stopped within
        ``timeout`` seconds (None: wait for it)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _drop(self, job: Job) -> None:
        job.state = DROPPED
        self._queued -= 1

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

    def _first(self, timeout: Optional[float]) -> Optional[Job]:
        """The first waiting job, left in line (None after ``timeout`` seconds, or once stopping
        with nothing left)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._waiting:
                if self._stopping:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._waiting[0]

    def _collect(self) -> Optional[list[Job]]:
        """The next jobs to run together, or None once stopped."""
        jobs: list[Job] = []
        cost, until, joint = 0, None, SearchShape()
        while until is None or cost < self.budget_tokens:
            job = self._first(None if until is None else max(0.0, until - time.monotonic()))
            if job is None:
                break
            if job.cost is None:
                job.cost = self._cost(job)  # outside the lock: encoding takes a while
            joined = joint.joined(job.shape) if job.shape is not None else joint
            if jobs and (cost + job.cost > self.budget_tokens or not self._fits(joined)):
                break  # it stays first in line for the next call
            with self._cond:
                if not self._waiting or self._waiting[0] is not job:
                    continue  # abandoned while its cost was worked out
                self._waiting.popleft()
            jobs.append(job)
            cost, joint = cost + job.cost, joined
            until = jobs[0].arrived + self.window_s
        return jobs if jobs or not self._stopping else None

    def _fits(self, shape: SearchShape) -> bool:
        return self.max_search_bytes is None or shape.bytes(self.engine) <= self.max_search_bytes

    def _cost(self, job: Job) -> int:
        """Source pieces x beam, as the translator's own token budget counts them."""
        pieces = sum(len(ids) for ids in self.engine.src_vocab.encode_batch(job.texts))
        return max(pieces, 1) * job.decode.get("beam_size", self.base.beam_size)

    def _start(self, group: list[Job]) -> list[Job]:
        """The jobs of ``group`` still wanted, now running; the others are dropped."""
        with self._cond:
            running = []
            for job in group:
                if job.state != WAITING:
                    continue
                if job.abandoned or not job.future.set_running_or_notify_cancel():  # not wanted, or cancelled
                    self._drop(job)
                    continue
                job.state = RUNNING
                self._queued -= 1
                running.append(job)
            return running

    def _translate(self, group: list[Job]) -> None:
        """One translator call for jobs that share settings; each gets its own slice."""
        group = self._start(group)
        if not group:
            return
        options = dataclasses.replace(self.base, **group[0].decode)
        texts = [text for job in group for text in job.texts]
        guides = [guide for job in group for guide in (job.guides or [Guide()] * len(job.texts))]
        try:
            engine = watched(self.engine.with_options(options), lambda: all(job.abandoned for job in group))
            translator = Translator(engine, options)
            sources, hypotheses = translator.hypotheses(texts, guides=guides if any(guides) else None)
        except Exception as err:  # a bug or an exhausted device: this batch fails, the server goes on
            with self._cond:
                if not isinstance(err, Interrupted):
                    self._stats["failed_batches"] += 1
                for job in group:
                    job.state = DONE
            for job in group:
                job.future.set_exception(err)
            return
        with self._cond:  # counted before any answer leaves, so a client's next /health includes its request
            answered = [job for job in group if not job.abandoned]
            for job in group:
                job.state = DONE
            self._stats["truncated_lines"] += translator.truncated
            self._stats["requests"] += len(answered)
            self._stats["lines"] += sum(len(job.texts) for job in answered)
            self._stats["batches"] += 1
            self._stats["largest_batch_requests"] = max(self._stats["largest_batch_requests"], len(group))
        self.metrics.batch(len(group), len(texts))
        start = 0
        for job in group:
            end = start + len(job.texts)
            prefixes = [guide.prefix for guide in guides[start:end]]
            job.future.set_result(answer(translator, sources[start:end], hypotheses[start:end], prefixes))
            start = end


def watched(engine, stop: Callable[[], bool]):
    """``engine`` (a fresh one, from ``with_options``) whose search raises Interrupted once
    ``stop()`` is true: checked before each search call and, where the engine runs a torch
    model, before each decoder step, since one call of a long text under a wide beam and a
    large min_len runs for a minute and more."""
    model = getattr(engine, "model", None)
    if model is not None and hasattr(model, "decode_step"):
        engine.model = _Stoppable(model, stop, "decode_step")
    return _Stoppable(engine, stop, "search")


class _Stoppable:
    """``inner`` as it is, but its method ``method`` raises Interrupted once ``stop()`` is true."""

    def __init__(self, inner, stop: Callable[[], bool], method: str) -> None:
        self._inner, self._stop, self._method = inner, stop, method

    def __getattr__(self, name: str):
        found = getattr(self._inner, name)
        if name != self._method:
            return found

        def checked(*args, **kwargs):
            if self._stop():
                raise Interrupted()
            return found(*args, **kwargs)
        return checked


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
