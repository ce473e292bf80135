"""Vocabularies whose ids come from a list of pieces, not from the SentencePiece model.

A model trained by another toolkit (MarianMT, ``nmtkit import``) numbers its pieces by its own
``vocab.json``; SentencePiece only splits text into pieces. Such a model directory keeps, beside
each SentencePiece model, an id map (``spm.src.model`` -> ``spm.src.ids.json``, ``id_map_of``), which
travels with the model wherever nmtkit copies it (``vocab.from``, checkpoints):

    {"format": "nmtkit-id-map", "pieces": [piece of id 0, piece of id 1, ...],
     "original_ids": [the importer's id of each piece, or null], "append_eos": bool,
     "tag_style": "marian"}

Ids 0-3 are nmtkit's specials (pad, unk, bos, eos: ``nmtkit.specials``), so search, batching
and the loss work on an imported model unchanged; ``original_ids`` lets an export undo the
renumbering. ``append_eos``: sources end in EOS (Marian's encoders were trained so). Target-
language tags are Marian's ``>>xx<<``, written first in the text and one id each.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Optional, Sequence

from nmtkit.storage.checksums import verify
from nmtkit.data.vocab import Vocab, id_map_of, load_spm
from nmtkit.errors import DataError
from nmtkit.specials import EOS, UNK

ID_MAP_FORMAT = "nmtkit-id-map"
MARIAN_TAG = re.compile(r">>[^\s<>]+<<")
MAX_MAP_BYTES = 64 << 20


def marian_tag(lang: str) -> str:
    return f">>{lang}<<"


def split_language_code(text: str) -> tuple[str, str]:
    """(">>xx<<", rest) when ``text`` starts with a Marian language code, else ("", text)."""
    match = MARIAN_TAG.match(text)
    return (match.group(0), text[match.end():]) if match else ("", text)


class MappedVocab(Vocab):
    """SentencePiece for splitting text, an id map for numbering its pieces (see the module doc)."""

    def __init__(self, spm_path: str | Path, map_path: str | Path) -> None:
        self.path, self.map_path = Path(spm_path), Path(map_path)
        self.sp = load_spm(self.path)
        spec = read_id_map(self.map_path)
        self._pieces: list[str] = spec["pieces"]
        self.original_ids: list[Optional[int]] = spec["original_ids"]
        self.append_eos: bool = spec["append_eos"]
        self._ids = {piece: i for i, piece in enumerate(self._pieces)}

    def __len__(self) -> int:
        return len(self._pieces)

    def piece_id(self, piece: str) -> int:
        return self._ids.get(piece, UNK)

    def encode(self, text: str) -> list[int]:
        """A leading ``>>xx<<`` as its one id, the rest split by SentencePiece, EOS last for sources
        (but for a blank line, which nmtkit leaves untranslated)."""
        code, rest = split_language_code(text)
        ids = [self.piece_id(code)] if code else []
        ids += [self.piece_id(piece) for piece in self.sp.EncodeAsPieces(rest)]
        return ids + [EOS] if self.append_eos and ids else ids  # a blank line stays blank

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: a piece the SentencePiece model lacks (a joint vocabulary's
        piece of the other language) comes out as written, its "▁" a space, as MarianTokenizer does."""
        text = self.sp.DecodePieces([self._pieces[int(i)] for i in ids if int(i) > EOS])
        return text.replace("\u2581", " ").strip()

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self._pieces[int(i)] for i in ids]

    def is_reserved(self, piece: str) -> bool:
        """A target-language tag is one id wherever it is written first (``encode``)."""
        return MARIAN_TAG.fullmatch(piece) is not None and piece in self._ids

    def tag_for(self, lang: str) -> str:
        return marian_tag(lang)

    def target_tags(self) -> list[str]:
        return [piece for piece in self._pieces if MARIAN_TAG.fullmatch(piece)]

    def target_languages(self) -> list[str]:
        return [tag[2:-2] for tag in self.target_tags()]

    def surfaces(self, ids: Iterable[int], unknown: str = "") -> list[str]:
        out = []
        for i in map(int, ids):
            piece = self._pieces[i]
            if i == UNK:
                out.append(unknown)
            elif i <= EOS or MARIAN_TAG.fullmatch(piece):
                out.append("")
            elif self.sp.IsByte(self.sp.PieceToId(piece)):
                out.append("\ufffd")
            else:
                out.append(piece.replace("\u2581", " "))
        return out

    def normalize(self, text: str) -> str:
        return self.sp.DecodePieces(self.sp.EncodeAsPieces(text))


def read_id_map(path: Path) -> dict:
    """An id map as ``MappedVocab`` reads it, or a one-line DataError naming what is wrong."""
    try:
        if path.stat().st_size > MAX_MAP_BYTES:
            raise DataError(f"{path}: too large for an id map")
        spec = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise DataError(f"{path}: cannot read the id map ({err.strerror})") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise DataError(f"{path}: not an id map ({type(err).__name__})") from None
    pieces = spec.get("pieces") if isinstance(spec, dict) else None
    if not (isinstance(spec, dict) and spec.get("format") == ID_MAP_FORMAT and isinstance(pieces, list)
            and all(isinstance(p, str) for p in pieces) and len(set(pieces)) == len(pieces) > EOS):
        raise DataError(f"{path}: not an id map (format {ID_MAP_FORMAT}, unique pieces)")
    original = spec.get("original_ids")
    if not (isinstance(original, list) and len(original) == len(pieces)
            and all(i is None or (isinstance(i, int) and not isinstance(i, bool)) for i in original)):
        raise DataError(f"{path}: original_ids must give one id (or null) per piece")
    if not isinstance(spec.get("append_eos"), bool):
        raise DataError(f"{path}: append_eos must be true or false")
    return spec


def write_id_map(path: Path, pieces: list[str], original_ids: list[Optional[int]], append_eos: bool) -> None:
    from nmtkit.storage.files import atomic_write_text

    spec = {"format": ID_MAP_FORMAT, "tag_style": "marian", "append_eos": append_eos,
            "pieces": pieces, "original_ids": original_ids}
    atomic_write_text(path, json.dumps(spec, ensure_ascii=False) + "\n")


def open_vocab(spm_path: str | Path) -> Vocab:
    """The vocabulary of a SentencePiece model: numbered by its id map when one lies beside it."""
    sibling = id_map_of(spm_path)
    return MappedVocab(spm_path, sibling) if sibling.is_file() else Vocab(spm_path)


def sibling_id_maps(spm_src: str | Path, spm_tgt: str | Path) -> Optional[tuple[Path, Path]]:
    """The id maps beside both SentencePiece models, or None (models nmtkit trained have none)."""
    maps = id_map_of(spm_src), id_map_of(spm_tgt)
    found = [path.is_file() for path in maps]
    if any(found) and not all(found):
        raise DataError(f"{maps[found.index(False)]}: missing, but {maps[found.index(True)].name} is there "
                        f"(an imported model's vocabulary has an id map per side)")
    return maps if all(found) else None


def load_vocabs(directory: Path, meta: dict) -> tuple[Vocab, Vocab]:
    """The (source, target) vocabularies a model or export directory's metadata names: its
    SentencePiece models (``meta["spm"]``), numbered by their id maps (``meta["id_maps"]``) when
    it has them. Verified against the directory's checksums.json by the caller."""
    spm, maps = meta["spm"], meta.get("id_maps")
    if maps:
        verify(directory, sorted(set(maps.values())), DataError)
    joint = spm["src"] == spm["tgt"] and (not maps or maps["src"] == maps["tgt"])
    sides = ("src",) if joint else ("src", "tgt")  # a joint vocabulary is loaded once (a vocab is read-only)
    loaded = [MappedVocab(directory / spm[side], directory / maps[side]) if maps else Vocab(directory / spm[side])
              for side in sides]
    return loaded[0], loaded[-1]


def vocab_files(meta: dict) -> list[str]:
    """Every vocabulary file a directory's metadata names (SentencePiece models and id maps)."""
    return sorted({*meta["spm"].values(), *(meta.get("id_maps") or {}).values()})
