"""Whether a checked request fits the server's memory bound, decided before it is queued.

Count limits (lines, characters, phrases, beam) do not bound memory: 32 long constraint
phrases under beam 16 ask for more than a hundred gigabytes. So the request is cut into
the search calls the translator would make for it (its own ``token_batches``), each call's
peak is estimated by ``decoding.cost.estimate_search_bytes``, and the request is refused
with 413 naming ``--max-search-bytes`` when the largest is over it. The batcher runs a
request with constraints in calls of its own, so no other request's phrases widen them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

from nmtkit.decoding.batching import token_batches
from nmtkit.decoding.cost import estimate_search_bytes, format_bytes
from nmtkit.decoding.guides import Guide, target_ids
from nmtkit.decoding.translate import Translator
from nmtkit.serving.requests import Limits, RequestError

FLOAT_BYTES = 4  # the decoder state is estimated in float32, the widest dtype translate runs


def decoder_state_bytes(engine) -> int:
    """Bytes of decoder state per row and output position: keys and values of every decoder
    layer of every model the engine holds (0 for an engine without torch models, such as
    CTranslate2, whose state the estimate then leaves out)."""
    model = getattr(engine, "model", None)
    if model is None:
        return 0
    configs = [module.cfg for module in model.modules() if hasattr(getattr(module, "cfg", None), "decoder_layers")]
    return sum(2 * FLOAT_BYTES * cfg.width * cfg.decoder_layers for cfg in configs)


def request_search_bytes(engine, options, texts: Sequence[str], guides: Optional[Sequence[Guide]]) -> int:
    """The estimated peak bytes of the largest search call ``Translator(engine, options)``
    makes to translate ``texts`` (with ``guides``) on its own."""
    translator = Translator(engine, options)
    sources = translator.encode(texts)
    todo = [i for i, ids in enumerate(sources) if ids]
    prefixes, phrases = target_ids(engine.tgt_vocab, guides) if guides is not None and any(guides) else (None, None)
    rows = options.nbest if options.sample else options.beam_size
    state_bytes, vocab, largest = decoder_state_bytes(engine), len(engine.tgt_vocab), 0
    for batch in token_batches([len(sources[i]) for i in todo], options.batch_tokens, rows):
        positions = [todo[i] for i in batch]
        source = max(len(sources[i]) for i in positions)
        output = max(math.floor(options.max_len_a * len(sources[i]) + options.max_len_b) for i in positions)
        if prefixes is not None:
            output = max(output, max(len(prefixes[i]) for i in positions))
        if engine.max_positions:
            output = min(output, engine.max_positions - 1)
        pieces = max(sum(len(p) for p in phrases[i]) for i in positions) if phrases is not None else 0
        largest = max(largest, estimate_search_bytes(len(positions), source, output, rows, vocab, pieces,
                                                     options.alignments, state_bytes))
    return largest


def admit(engine, base, limits: Limits, texts: Sequence[str], decode: dict[str, Any],
          guides: Optional[Sequence[Guide]]) -> None:
    """A RequestError (413) when the request's largest search call would need more than
    ``limits.max_search_bytes``; ``decode`` is the request's settings over the server's ``base``."""
    options = dataclasses.replace(base, **decode)
    needed = request_search_bytes(engine, options, texts, guides)
    if needed > limits.max_search_bytes:
        raise RequestError(413, f"this request would need about {format_bytes(needed)} for one search, over the "
                                f"server's {format_bytes(limits.max_search_bytes)} (--max-search-bytes): send fewer "
                                "or shorter texts or constraint phrases, or a smaller beam_size", "search_memory")
