"""Whether a checked request fits the server's memory bound, decided before it is queued.

Count limits (lines, characters, phrases, beam) do not bound memory: 32 long constraint
phrases under beam 16 ask for tens of gigabytes. So the request is cut into the search
calls the translator would make for it (its own ``token_batches``), each call's peak is
estimated by ``decoding.cost.estimate_search_bytes``, and the request is refused with 413
naming ``--max-search-bytes`` when the largest is over it. Its ``SearchShape`` (the whole
request as one call: an upper bound of any call holding its lines) goes with it to the
batcher, which joins requests into one translator call only while their joint shape fits.
Encoding the texts here also tells which of them the model will see cut to its positions, which
the answer names (``truncated``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from nmtkit.decoding.batching import token_batches
from nmtkit.decoding.cost import estimate_search_bytes
from nmtkit.decoding.guides import Guide, target_ids
from nmtkit.decoding.translate import Translator
from nmtkit.serving.requests import Limits, RequestError

FLOAT_BYTES = 4  # the decoder state is estimated in float32, the widest dtype translate runs


@dataclass(frozen=True)
class SearchShape:
    """What sizes a search call: its sentences and, over them, the longest source, the
    longest output allowed, the rows per sentence, the most constraint pieces."""

    sentences: int = 0
    source: int = 0
    output: int = 0
    beam: int = 1
    pieces: int = 0
    alignments: bool = False

    def joined(self, other: "SearchShape") -> "SearchShape":
        """A shape no smaller than any call holding sentences of both (the estimate grows
        with every field)."""
        return SearchShape(self.sentences + other.sentences, max(self.source, other.source),
                           max(self.output, other.output), max(self.beam, other.beam),
                           max(self.pieces, other.pieces), self.alignments or other.alignments)

    def bytes(self, engine) -> int:
        return estimate_search_bytes(self.sentences, self.source, self.output, self.beam, len(engine.tgt_vocab),
                                     self.pieces, self.alignments, decoder_state_bytes(engine))


def decoder_state_bytes(engine) -> int:
    """Bytes of decoder state per row and output position: keys and values of every decoder
    layer of every model the engine holds (0 for an engine without torch models, such as
    CTranslate2, whose state the estimate then leaves out)."""
    model = getattr(engine, "model", None)
    if model is None:
        return 0
    configs = [module.cfg for module in model.modules() if hasattr(getattr(module, "cfg", None), "decoder_layers")]
    return sum(2 * FLOAT_BYTES * cfg.width * cfg.decoder_layers for cfg in configs)


def search_shapes(engine, options, texts: Sequence[str], guides: Optional[Sequence[Guide]]) -> list[SearchShape]:
    """The shape of every search call ``Translator(engine, options)`` makes to translate
    ``texts`` (with ``guides``) on its own."""
    return shapes_of(engine, options, Translator(engine, options).encode(texts), guides)


def encode_each(engine, options, texts: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
    """The source ids of each text as ``Translator(engine, options)`` cuts them, and whether
    it was cut (over the model's positions): one text at a time, so each gets its own answer."""
    translator = Translator(engine, options)
    sources, cut = [], []
    for text in texts:
        before = translator.truncated
        sources += translator.encode([text])
        cut.append(translator.truncated > before)
    return sources, cut


def shapes_of(engine, options, sources: Sequence[Sequence[int]], guides: Optional[Sequence[Guide]]) -> list[SearchShape]:
    """``search_shapes`` of texts already encoded (``sources``)."""
    todo = [i for i, ids in enumerate(sources) if ids]
    prefixes, phrases = target_ids(engine.tgt_vocab, guides) if guides is not None and any(guides) else (None, None)
    rows = options.nbest if options.sample else options.beam_size
    shapes = []
    for batch in token_batches([len(sources[i]) for i in todo], options.batch_tokens, rows):
        positions = [todo[i] for i in batch]
        output = max(math.floor(options.max_len_a * len(sources[i]) + options.max_len_b) for i in positions)
        if prefixes is not None:
            output = max(output, max(len(prefixes[i]) for i in positions))
        if engine.max_positions:
            output = min(output, engine.max_positions - 1)
        pieces = max(sum(len(p) for p in phrases[i]) for i in positions) if phrases is not None else 0
        shapes.append(SearchShape(len(positions), max(len(sources[i]) for i in positions), output, rows, pieces,
                                  options.alignments))
    return shapes


def admit(engine, base, limits: Limits, texts: Sequence[str], decode: dict[str, Any],
          guides: Optional[Sequence[Guide]]) -> tuple[SearchShape, list[bool]]:
    """The request's shape as one call, and which texts the model will see cut (over its
    positions); a RequestError (413) when one of its own search calls would need more than
    ``limits.max_search_bytes``. ``decode`` is the request's settings over the server's ``base``."""
    options = dataclasses.replace(base, **decode)
    sources, cut = encode_each(engine, options, texts)
    shapes = shapes_of(engine, options, sources, guides)
    needed = max((shape.bytes(engine) for shape in shapes), default=0)
    if needed > limits.max_search_bytes:
        raise RequestError(413, f"this request would need about {format_bytes(needed)} for one search, over the "
                                f"server's {format_bytes(limits.max_search_bytes)} (--max-search-bytes): send fewer "
                                "or shorter texts or constraint phrases, or a smaller beam_size", "search_memory")
    whole = SearchShape()
    for shape in shapes:
        whole = whole.joined(shape)
    return whole, cut


def format_bytes(count: int) -> str:
    """``count`` bytes in the largest binary unit that keeps a number >= 1 (``1.5 GiB``)."""
    value, unit = float(count), "bytes"
    for name in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, name
    return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
