"""``nmtkit translate --engine ctranslate2``: decode a model exported by ``nmtkit export``.

Everything around the search is shared with the torch engine: lines are read, encoded,
batched by tokens, put back in order and written by ``Translator`` and ``translate_files.py``
(one output line per input line, atomic files, truncation warned once); only the search runs
in CTranslate2, on our own SentencePiece ids (as pieces, one to one with its vocabulary).

Differences from the torch engine, by CTranslate2's design:
- beam search ranks finished hypotheses by logprob / L ** lenpen (L the pieces, EOS
  included) instead of GNMT's ((5 + L) / 6) ** lenpen; greedy search is the same.
  CTranslate2 renormalises the distribution after banning PAD/BOS (and EOS before
  ``min_len``), so when scores are printed (--scores, --nbest) the outputs are re-scored
  with ``score_batch``: the model's own log-probabilities under our GNMT rule, as the torch
  engine prints them (with ``eos_at_limit`` free, an output at its limit without its EOS's
  log-probability: CTranslate2 ends such an output without ranking an EOS, as that rule does).
- the length limit a * |x| + b is applied per batch (its longest sentence's) and outputs
  are then cut to their own limit, so a sentence that runs into its limit ends there
  without the EOS our search forces (its pieces are the same under greedy search).
- sampling: CTranslate2 seeds a translator's worker thread once, at its first draw, so the model
  is loaded again for each chunk after the first (``reseed``), whose seed is then its own.
- one model only (no ensembles); ``--dtype`` picks CTranslate2's compute type
  (auto: the exported weights' type; int8 works from a float32 export too).
- target prefixes are its ``target_prefix``; lexical constraints are refused, as
  CTranslate2 (4.x) has no constrained search (``prefix_bias_beta`` and
  ``suppress_sequences`` steer towards a prefix or away from sequences, not towards
  phrases anywhere in the output).
"""
from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from nmtkit.config import ModelConfig
from nmtkit.ctranslate2.export import META, import_ctranslate2
from nmtkit.data.mapped_vocab import load_vocabs
from nmtkit.data.vocab import Vocab
from nmtkit.decoding.hypothesis import Hypothesis, length_penalty, output_limit
from nmtkit.errors import CheckpointError, ConfigError
from nmtkit.storage.files import read_regular
from nmtkit.modeldir import plain_name, read_json
from nmtkit.specials import BOS, EOS, PAD
from nmtkit.storage.checksums import MANIFEST, read_manifest, verify

COMPUTE_TYPES = {"auto": "default", "float32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}
NO_CONSTRAINTS = ("--constraints needs the torch engine: CTranslate2 has no lexically constrained search "
                  "(only target prefixes); translate the model directory, not its export")


def read_export_meta(model_dir: str | Path) -> dict:
    """Our metadata of an exported model, or a one-line error saying how to export one."""
    model_dir = Path(model_dir)
    path = model_dir / META
    if not path.is_file():
        hint = (f"run `nmtkit export {model_dir} --format ctranslate2 -o OUT` and translate with -m OUT"
                if (model_dir / "model.safetensors").is_file() else f"{model_dir} has no {META}")
        raise ConfigError(f"engine ctranslate2 needs an exported model; see nmtkit export: {hint}")
    manifest = read_manifest(model_dir, CheckpointError)
    if manifest is not None:  # every file, CTranslate2's own included: we cannot know which it reads
        verify(model_dir, sorted(manifest), CheckpointError, manifest)
    meta = read_json(path, "CTranslate2 export description")
    spm = meta.get("spm") if isinstance(meta, dict) else None
    positions = meta.get("max_positions") if isinstance(meta, dict) else None
    if not (isinstance(spm, dict) and all(isinstance(spm.get(side), str) and plain_name(spm[side])
                                          for side in ("src", "tgt"))
            and (positions is None or (isinstance(positions, int) and not isinstance(positions, bool)
                                       and positions > 0))):
        raise CheckpointError(f"{path}: not an nmtkit export description (spm names, max_positions)")
    if manifest is None and meta.get("checksums"):
        raise CheckpointError(f"{model_dir / MANIFEST}: missing ({META} says the export has one)")
    return meta


MAX_VOCABULARY_BYTES = 256 << 20  # a million pieces of SentencePiece's longest, JSON-escaped


def check_vocabularies(model_dir: Path, src_vocab: Vocab, tgt_vocab: Vocab) -> None:
    """CTranslate2's vocabulary files must list the SentencePiece models' pieces, id for id,
    as ``nmtkit export`` wrote them: checksums only say a file is the one listed, and one
    cut short, emptied or reordered (the manifest rewritten to match) would load and map ids
    to the wrong pieces, or fail inside CTranslate2."""
    src, tgt = (vocab.pieces(range(len(vocab))) for vocab in (src_vocab, tgt_vocab))
    shared = model_dir / "shared_vocabulary.json"
    expected = {shared.name: src} if os.path.lexists(shared) else \
        {"source_vocabulary.json": src, "target_vocabulary.json": tgt}
    if os.path.lexists(shared) and src != tgt:
        raise CheckpointError(f"{shared}: one vocabulary for two different SentencePiece models")
    for name, pieces in expected.items():
        path = model_dir / name
        data = read_regular(path, MAX_VOCABULARY_BYTES, CheckpointError, "CTranslate2 vocabulary")
        try:
            listed = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            listed = None
        if listed != pieces:
            raise CheckpointError(f"{path}: not the {len(pieces):,} pieces of the export's SentencePiece model "
                                  f"(cut short, emptied or edited); export the model again")


def ct2_device(name: str) -> tuple[str, int]:
    """Our --device (auto, cpu, cuda, cuda:N) as CTranslate2's (device, device_index)."""
    ctranslate2 = import_ctranslate2()
    if name == "auto":
        return ("cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"), 0
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise ConfigError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)")
    if kind == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise ConfigError(f"device {name!r} requested but CTranslate2 sees no CUDA device")
    return kind, int(index or 0)


class CT2Engine:
    """An exported model searched by CTranslate2: the engine ``Translator`` takes (see
    ``decoding/torch_engine.py`` for what an engine offers)."""

    constrained_search = False  # see NO_CONSTRAINTS
    batch_workers = 1  # one batch at a time, on every thread (intra_threads)

    def __init__(self, model_dir: str | Path, options, threads: Optional[Callable[[], int]] = None) -> None:
        """``threads`` chooses CTranslate2's intra_threads, called only once the vocabularies are
        read (None: PyTorch's count, for a caller that set it and runs torch anyway)."""
        meta = read_export_meta(model_dir)
        ctranslate2 = import_ctranslate2()
        model_dir = Path(model_dir)
        if options.dtype not in COMPUTE_TYPES:
            raise ConfigError(f"--dtype {options.dtype} is not available with --engine ctranslate2")
        device, index = ct2_device(options.device)
        self.src_vocab, self.tgt_vocab = load_vocabs(model_dir, meta)
        check_vocabularies(model_dir, self.src_vocab, self.tgt_vocab)
        if threads is None:
            import torch

            threads = torch.get_num_threads
        intra_threads = threads()
        self.model_dir = model_dir
        self.load = functools.partial(ctranslate2.Translator, str(model_dir), device=device, device_index=index,
                                      compute_type=COMPUTE_TYPES[options.dtype], intra_threads=intra_threads)
        self.drawn = False  # whether self.ct2 has sampled: see reseed
        self.ct2 = self._loaded()
        self.options, self.max_positions = options, meta["max_positions"]
        configured = meta.get("model", {}).get("max_positions") if isinstance(meta.get("model"), dict) else None
        self.input_limit = self.max_positions or (configured if isinstance(configured, int) and configured > 0
                                                  else ModelConfig().max_positions)  # see torch_engine.input_limit
        self.description = f"with CTranslate2 {ctranslate2.__version__} on {device}, compute type {self.ct2.compute_type}"
        self.never = [self.tgt_vocab.pieces([PAD]), self.tgt_vocab.pieces([BOS])]  # as our search
        if options.sample:
            self.reseed(options.seed)
        self.search_settings = self.bind(options)

    def bind(self, o) -> dict:
        """The search settings of options ``o``, bound once (the length limit is per batch)."""
        # a top k past the vocabulary keeps every piece, as the torch engine's; CTranslate2 refuses it
        search = dict(sampling_topk=min(o.topk, len(self.tgt_vocab)), sampling_topp=o.topp,
                      sampling_temperature=o.temperature, beam_size=1) if o.sample else \
            dict(beam_size=o.beam_size, num_hypotheses=o.nbest)
        return dict(max_input_length=0, length_penalty=o.lenpen,
                    return_scores=True, return_end_token=True, suppress_sequences=self.never,
                    return_attention=o.alignments, **search,
                    # CTranslate2's batched attention differs in its last bits with the batch's
                    # padding, enough to move an argmax alignment: with alignments each sentence is
                    # decoded alone, so its alignment does not depend on the lines around it
                    **({"max_batch_size": 1} if o.alignments else {}))

    def with_options(self, options) -> "CT2Engine":
        """The same loaded model searched with other decode settings (device and compute type stay)."""
        other = copy.copy(self)
        other.options, other.search_settings = options, self.bind(options)
        return other

    def _loaded(self):
        """A CTranslate2 translator of the export, or a one-line error."""
        try:
            return self.load()
        except (RuntimeError, ValueError, OSError) as err:  # a damaged model.bin, config or vocabulary
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CheckpointError(f"{self.model_dir}: CTranslate2 cannot load this export ({first})") from None

    def reseed(self, seed: int) -> None:
        """Restart sampling from ``seed``, taken modulo 2 ** 32 - 1: CTranslate2's seed is an
        unsigned 32-bit number (``chunk_seed`` gives 63 bits) whose largest value means "a random
        seed", which a given seed must never become. CTranslate2 seeds a translator's worker thread
        once, at its first draw, from the process's seed: a translator that has drawn is loaded
        again (the old one dropped first: two at once would need twice the memory), so that the
        seed reaches its draws (a resumed run then samples as one that ran through)."""
        import_ctranslate2().set_random_seed(seed % (2**32 - 1))
        if self.drawn:
            self.ct2, self.drawn = None, False
            self.ct2 = self._loaded()

    def batch(self, sources: Sequence[Sequence[int]]) -> tuple[list[list[int]]]:
        """What ``search`` takes: the source ids as they are (no tensors, no torch)."""
        return ([list(ids) for ids in sources],)

    def search(self, ids: list[list[int]], prefixes=None, constraints=None) -> list[list[Hypothesis]]:
        """Hypotheses per sentence of source ids; ``prefixes`` (pieces per sentence) become
        CTranslate2's ``target_prefix``; lexical ``constraints`` it has no search for."""
        if constraints is not None:
            raise ConfigError(NO_CONSTRAINTS)
        o = self.options
        limits = [output_limit(seq, o.max_len_a, o.max_len_b, self.max_positions,
                               0 if prefixes is None else len(prefixes[b])) for b, seq in enumerate(ids)]
        per = o.nbest if o.sample else 1  # CTranslate2 samples one hypothesis per input: repeat inputs
        pieces = [self.src_vocab.pieces(seq) for seq in ids for _ in range(per)]
        if max(limits) == 0:  # nothing to search: every output is empty (its forced EOS scored below)
            out = [[Hypothesis([], 0.0, 0.0) for _ in range(per)] for _ in ids]
        else:
            target_prefix = None if prefixes is None else \
                [self.tgt_vocab.pieces(prefix[:limit]) for prefix, limit in zip(prefixes, limits) for _ in range(per)]
            self.drawn = self.drawn or o.sample
            # the length limit wins over min_len, as in our search (CTranslate2 refuses a minimum above it)
            results = self.ct2.translate_batch(pieces, target_prefix=target_prefix, max_decoding_length=max(limits),
                                               min_decoding_length=min(o.min_len, max(limits)), **self.search_settings)
            out = [[self._hypothesis(result, k, limit, len(ids[b]))
                    for result in results[b * per:(b + 1) * per] for k in range(len(result.hypotheses))]
                   for b, limit in enumerate(limits)]
        if o.scores or o.nbest > 1:
            self._rescore(pieces[::per], out, limits)
        return [sorted(hyps, key=lambda h: -h.score) for hyps in out]

    def _rescore(self, sources: list[list[str]], hyps: list[list[Hypothesis]], limits: list[int]) -> None:
        """Set each hypothesis' logprob (EOS included, but 0 for an output at its length limit
        ``limits`` [B] with ``eos_at_limit`` free, as in our search) and GNMT score from ``score_batch``."""
        flat = [(b, h) for b, row in enumerate(hyps) for h in row]
        results = self.ct2.score_batch([sources[b] for b, _ in flat],
                                       [self.tgt_vocab.pieces(h.tokens) for _, h in flat], max_input_length=0)
        for (b, hyp), result in zip(flat, results):
            free = self.options.eos_at_limit == "free" and len(hyp.tokens) >= limits[b]
            hyp.logprob = float(sum(result.log_probs[:-1] if free else result.log_probs))
            hyp.score = hyp.logprob / length_penalty(len(hyp.tokens), self.options.lenpen)

    def _hypothesis(self, result, k: int, limit: int, src_len: int) -> Hypothesis:
        """CTranslate2's k-th hypothesis as ours: ids cut to ``limit``, GNMT score."""
        pieces = result.hypotheses[k]
        tokens = [self.tgt_vocab.piece_id(piece) for piece in pieces]
        # CTranslate2's score is logprob / n ** lenpen, n the generated pieces (EOS included)
        logprob = result.scores[k] * max(len(tokens), 1) ** self.options.lenpen
        if tokens and tokens[-1] == EOS:
            tokens = tokens[:-1]
        tokens = tokens[:limit]
        attention = None
        if self.options.alignments:  # alignments are read from tensors (decoding/alignment.py): torch only then
            import torch

            attention = torch.tensor(result.attention[k], dtype=torch.float32)[:len(tokens), :src_len]
        return Hypothesis(tokens, logprob / length_penalty(len(tokens), self.options.lenpen), logprob, attention)
