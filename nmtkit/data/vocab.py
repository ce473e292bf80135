"""SentencePiece vocabularies with the fixed special ids every model relies on.

pad=0, unk=1, bos=2, eos=3 (``nmtkit.specials``). A joint model is one file,
``spm.model``; separate vocabularies are ``spm.src.model`` and ``spm.tgt.model``.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from nmtkit.errors import ConfigError, DataError
from nmtkit.specials import EOS, PAD, SPM_SPECIAL_IDS, UNK
from nmtkit.storage.checksums import verify
from nmtkit.storage.files import shown_path

TARGET_TAG = re.compile(r"<2[^\s>]+>")  # a target-language tag: <2es> asks for Spanish


def target_tag(lang: str) -> str:
    return f"<2{lang}>"


SPM_MAX_SENTENCE_BYTES = 4192  # SentencePiece's default max_sentence_length: the least we pass
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}  # sentencepiece_model.proto, TrainerSpec.ModelType


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a serialized protobuf message, top level only."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def spm_model_type(path: str | Path) -> str:
    """The algorithm a SentencePiece model was trained with (unigram, bpe, word, char), read from
    its ModelProto (trainer_spec = field 2, model_type = its field 3; unigram when unset): the
    Python API does not expose it, and protobuf is not a dependency."""
    try:
        for number, wire, value in _fields(Path(path).read_bytes()):
            if number == 2 and wire == 2:
                for inner, inner_wire, kind in _fields(value):
                    if inner == 3 and inner_wire == 0:
                        return _MODEL_TYPES.get(kind, f"type {kind}")
                return "unigram"
    except ValueError as err:
        raise DataError(f"{path}: not a SentencePiece model ({err})") from None
    return "unigram"


def with_tag(text: str, tag: str) -> str:
    """A source sentence with ``tag`` and a space before it (unchanged without a tag): how a corpus
    tag goes into training text, and a target-language tag into text to translate."""
    return f"{tag} {text}" if tag else text


def load_spm(path: Path):
    """A SentencePieceProcessor of ``path``, or a one-line DataError."""
    import sentencepiece as spm

    if not path.is_file():
        raise DataError(f"SentencePiece model not found: {path}")
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as err:
        raise DataError(f"{path}: not a valid SentencePiece model ({err})") from None
    return sp


class Vocab:
    """A loaded SentencePiece model: text <-> ids without BOS/EOS."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.sp = load_spm(self.path)
        if self.sp.pad_id() != PAD or self.sp.eos_id() != EOS:
            raise DataError(f"{self.path}: special ids differ from pad=0 unk=1 bos=2 eos=3")

    def __len__(self) -> int:
        return self.sp.GetPieceSize()

    def encode(self, text: str) -> list[int]:
        return self.sp.EncodeAsIds(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.EncodeAsIds(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.DecodeIds([int(i) for i in ids if int(i) > EOS])  # specials are the lowest ids

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.sp.IdToPiece(int(i)) for i in ids]

    def piece_id(self, piece: str) -> int:
        """The id of ``piece`` (UNK when the model has no such piece)."""
        return self.sp.PieceToId(piece)

    def tag_for(self, lang: str) -> str:
        """The tag that asks a multilingual model for ``lang``: <2es> in the models nmtkit trains."""
        return target_tag(lang)

    def is_reserved(self, piece: str) -> bool:
        """Whether ``piece`` is one piece wherever it appears (a tag reserved when the model was
        trained; a learned piece would merge with its neighbours, or be split)."""
        piece_id = self.sp.PieceToId(piece)
        return piece_id != UNK and self.sp.EncodeAsIds(f"x{piece}x").count(piece_id) == 1

    def target_tags(self) -> list[str]:
        """The reserved target-language tags of a multilingual model (<2es>, ...), in id order."""
        pieces = (self.sp.IdToPiece(i) for i in range(len(self)))
        return [piece for piece in pieces if TARGET_TAG.fullmatch(piece) and self.is_reserved(piece)]

    def target_languages(self) -> list[str]:
        """What ``--target-lang`` may name for this model: es for <2es>, ..., in id order."""
        return [tag[2:-1] for tag in self.target_tags()]

    def surfaces(self, ids: Iterable[int], unknown: str = "") -> list[str]:
        """The text each piece adds, for finding the whitespace word it belongs to: its piece
        with "\u2581" as a space; a byte piece one placeholder character; an unknown piece
        ``unknown`` (a source passes a placeholder: there it stands for text; ``decode`` drops it
        from an output); the other special and control pieces nothing."""
        out = []
        for i in map(int, ids):
            if self.sp.IsByte(i):
                out.append("\ufffd")
            elif i == UNK:
                out.append(unknown)
            elif i <= EOS or self.sp.IsControl(i):
                out.append("")
            else:
                out.append(self.sp.IdToPiece(i).replace("\u2581", " "))
        return out

    @property
    def byte_fallback(self) -> bool:
        """Whether the model has the byte pieces <0x00>..<0xFF>: unseen characters become bytes, not <unk>."""
        return bool(self.sp.IsByte(self.sp.PieceToId("<0x00>")))

    def normalize(self, text: str) -> str:
        """The text as SentencePiece normalises it (what decode(encode(x)) returns)."""
        return self.sp.DecodeIds(self.sp.EncodeAsIds(text))


def spm_files(joint: bool) -> tuple[str, str]:
    """File names of the (source, target) SentencePiece models in a prepared/model dir."""
    return ("spm.model", "spm.model") if joint else ("spm.src.model", "spm.tgt.model")


def train_spm(texts: Iterable[str], model_path: str | Path, vocab_size: int, model_type: str = "unigram",
              character_coverage: float = 1.0, input_sentence_size: int = 2_000_000, seed: int = 1,
              reserved: Sequence[str] = (), in_subprocess: bool = False, byte_fallback: bool = False,
              normalization: str = "nmt_nfkc", split_digits: bool = False, max_pieces: int = 0) -> None:
    """Train a SentencePiece model on ``texts`` and write ``model_path`` atomically. ``reserved``
    pieces (corpus tags) are user-defined symbols: always one piece, never split or merged.
    ``byte_fallback`` adds the 256 byte pieces <0x00>..<0xFF> (they count in ``vocab_size``):
    a character outside the learned pieces is encoded as its UTF-8 bytes instead of <unk>, and
    decoded back to itself. ``normalization`` is SentencePiece's rule name; ``split_digits``
    makes every digit its own piece. ``max_pieces`` (clean.max_len; 0: no limit): lines that
    cannot encode to so few pieces are left out (``fits_in_pieces``).

    ``vocab_size`` is a hard limit: SentencePiece fails on small corpora that cannot fill
    it, and we turn that into a one-line error suggesting a smaller ``vocab.size``.
    ``in_subprocess``: train in a child process, so the gigabytes SentencePiece takes for a
    large sample go back to the system when it ends instead of staying with this process.
    """
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    # resolved: a sweep's run directory (a linked prepared/ inside variants/NAME,seed=1,split=0/) has
    # commas where the shared one has none; the input goes as a list, which SentencePiece does not
    # split on its commas (a string it does)
    with tempfile.TemporaryDirectory(dir=model_path.parent.resolve()) as tmp:
        corpus = Path(tmp) / "corpus.txt"
        longest = 0  # bytes: SentencePiece skips longer lines (4,192 by default) unless told
        margin = max(map(len, reserved), default=0)
        with open(corpus, "w", encoding="utf-8") as handle:
            for line in texts:
                if line.strip() and (not max_pieces or fits_in_pieces(line, max_pieces, margin)):
                    line = line.replace("\n", " ")
                    longest = max(longest, len(line.encode("utf-8")))
                    handle.write(line + "\n")
        prefix = Path(tmp) / "spm"
        options = dict(input=[str(corpus)], model_prefix=str(prefix), vocab_size=vocab_size, model_type=model_type,
                       max_sentence_length=max(SPM_MAX_SENTENCE_BYTES, longest + 1),
                       character_coverage=character_coverage, input_sentence_size=input_sentence_size,
                       shuffle_input_sentence=True, minloglevel=2, num_threads=os.cpu_count() or 1,
                       byte_fallback=byte_fallback, normalization_rule_name=normalization, split_digits=split_digits,
                       **SPM_SPECIAL_IDS, **({"user_defined_symbols": list(reserved)} if reserved else {}))
        try:
            if in_subprocess:
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor

                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                    pool.submit(_train, seed, options).result()
            else:
                _train(seed, options)
        except RuntimeError as err:  # a killed child (out of memory) is a BrokenProcessPool, a RuntimeError
            message = (str(err).splitlines() or ["killed"])[-1]
            raise DataError(f"SentencePiece training failed: {message} ({spm_advice(message)})") from None
        os.replace(f"{prefix}.model", model_path)
        os.replace(f"{prefix}.vocab", model_path.with_suffix(".vocab"))


SPM_CHARS_PER_PIECE = 4 * 16  # 16: SentencePiece's max_piece_length; 4: normalisation composes at most 3 into 1


def fits_in_pieces(line: str, pieces: int, margin: int = 0) -> bool:
    """Whether ``line`` might encode to at most ``pieces`` pieces, so cleaning (clean.max_len) might
    keep it. A piece holds at most 16 characters (max_piece_length) and whitespace runs fold into
    one "▁", so a line with more than 64 non-space characters per piece (plus ``margin``, a
    reserved tag's length) cannot: SentencePiece's training time grows with the square of its
    longest line, and one such line would take minutes for a model that never sees it."""
    bound = pieces * SPM_CHARS_PER_PIECE + margin
    return len(line) <= bound or sum(map(len, line.split())) <= bound


def spm_advice(message: str) -> str:
    """What to change for SentencePiece's error ``message``: the vocabulary cannot hold the text's
    characters (a larger vocab.size), or anything else (a smaller one, or less memory)."""
    needed = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if needed:
        return (f"the text needs more than {needed.group(2)} pieces for its characters alone: raise "
                f"vocab.size, or lower vocab.character_coverage")
    return "try a smaller vocab.size, or a smaller vocab.input_sentence_size if it ran out of memory"


def _train(seed: int, options: dict) -> None:
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)  # deterministic sampling of the training sentences
    spm.SentencePieceTrainer.Train(**options)


SAMPLE_BLOCK = 1 << 20  # random keys drawn at a time


def sample_indices(total: int, size: int, seed: int) -> "np.ndarray":
    """``size`` distinct indices of range(``total``) drawn uniformly, sorted: those with the
    ``size`` smallest of one seeded random key each (a reservoir over keys, memory O(size))."""
    import numpy as np  # here only: translating reads vocabularies and never samples (0.1 s of start-up)

    if total <= size:
        return np.arange(total)
    rng = np.random.default_rng(seed)
    keys, indices = np.zeros(0), np.zeros(0, dtype=np.int64)
    for start in range(0, total, SAMPLE_BLOCK):
        block = min(SAMPLE_BLOCK, total - start)
        keys = np.concatenate([keys, rng.random(block)])
        indices = np.concatenate([indices, np.arange(start, start + block)])
        if len(keys) > size:
            best = np.argpartition(keys, size - 1)[:size]
            keys, indices = keys[best], indices[best]
    return np.sort(indices)


def sampled_lines(lines: Iterable[str], total: int, size: int, seed: int) -> Iterator[str]:
    """A uniform sample of ``size`` of the ``total`` ``lines``, over the whole corpus and in its
    order; all of them when ``size`` is 0 or covers them."""
    if not size or total <= size:
        yield from lines
        return
    wanted = iter(sample_indices(total, size, seed).tolist())
    next_index = next(wanted)
    for index, line in enumerate(lines):
        if index == next_index:
            yield line
            next_index = next(wanted, None)
            if next_index is None:
                return


def id_map_of(spm_path: str | Path) -> Path:
    """Where the id map of a SentencePiece model lives, if it has one (an imported model's:
    data/mapped_vocab.py): beside it, ``spm.src.model`` -> ``spm.src.ids.json``. A copy of the
    model (prepare's ``vocab.from``, a checkpoint) takes it along."""
    return Path(spm_path).with_suffix(".ids.json")


def reused_models(directory: str | Path, joint: bool) -> tuple[Path, Path]:
    """The (source, target) SentencePiece models of a model or prepared directory (``vocab.from``),
    verified against its checksums.json when it has one. nmtkit names them alike in both kinds
    of directory (``spm_files``), so the names alone tell the layout."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise DataError(f"directory not found: {shown_path(directory, 'vocab.from')}")
    layouts = [layout for layout in (True, False) if all((directory / name).is_file() for name in spm_files(layout))]
    if not layouts:
        raise DataError(f"{directory} (vocab.from) holds no SentencePiece model: expected spm.model, "
                        f"or spm.src.model and spm.tgt.model")
    if joint not in layouts:
        found = "one joint model" if layouts[0] else "separate source and target models"
        raise ConfigError(f"vocab.joint={str(joint).lower()} but {directory} (vocab.from) has {found}; "
                          f"set vocab.joint: {str(layouts[0]).lower()}")
    names = spm_files(joint)
    maps = [id_map_of(name).name for name in set(names) if id_map_of(directory / name).is_file()]
    verify(directory, sorted({*names, *maps}), DataError)
    return directory / names[0], directory / names[1]
