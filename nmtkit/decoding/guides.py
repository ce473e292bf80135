"""What a line may ask of its translation besides its source: a target prefix the output
starts with, and terminology constraints (target phrases the output contains).

``translate --prefix-file`` and ``--constraints`` give them one line per input line
(``GuideFiles``); both files are read and checked whole before any model loads.
``Translator`` encodes them with the target SentencePiece model (``target_ids``) for the
search and puts the prefix back as text (``prefixed_text``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from nmtkit.errors import DataError
from nmtkit.storage.files import read_lines

CONSTRAINTS_EXAMPLE = '["first term", "second term"]'


@dataclass(frozen=True)
class Guide:
    prefix: str = ""  # the output starts with exactly this text ("": no prefix)
    constraints: tuple[str, ...] = ()  # phrases the output must contain

    def __bool__(self) -> bool:
        return bool(self.prefix or self.constraints)

    @classmethod
    def of(cls, prefix: str = "", phrases: Sequence[str] = ()) -> "Guide":
        """A guide as a file line or a request gives it: a blank prefix is none, and the
        whitespace inside a phrase collapses to single spaces."""
        return cls(prefix if prefix.strip() else "", tuple(" ".join(phrase.split()) for phrase in phrases))


def parse_constraints(text: str, where: str) -> tuple[str, ...]:
    """The phrases of one constraints line: a JSON list of non-blank strings (a blank line or
    ``[]``: none)."""
    if not text.strip():
        return ()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not JSON ({err.msg} at column {err.colno}); "
                        f"write one list per line, such as {CONSTRAINTS_EXAMPLE}") from None
    except RecursionError:
        raise DataError(f"{where}: nested too deeply; write a list of strings, such as {CONSTRAINTS_EXAMPLE}") from None
    except ValueError as err:  # a number past Python's digit limit for int()
        raise DataError(f"{where}: not a list of phrases ({str(err).split(';')[0]}); "
                        f"write one list per line, such as {CONSTRAINTS_EXAMPLE}") from None
    if not isinstance(value, list) or not all(isinstance(phrase, str) for phrase in value):
        raise DataError(f"{where}: must be a JSON list of strings, such as {CONSTRAINTS_EXAMPLE}")
    if not all(phrase.strip() for phrase in value):
        raise DataError(f"{where}: a constraint phrase is empty")
    for phrase in value:
        try:  # JSON's \ud800 escape gives half of a surrogate pair, which no text can hold
            phrase.encode("utf-8")
        except UnicodeEncodeError as err:
            raise DataError(f"{where}: a phrase holds a lone surrogate escape ({ascii(phrase[err.start])}), "
                            f"which is not a character; write the character itself") from None
    return tuple(value)


def guides_digest(guides: Optional[Sequence[Guide]]) -> Optional[str]:
    """What a translation's guides ask for, as one digest of their content (None without
    guides). Taken from what was read, not from the files again: a pipe gives its lines
    once, and a named pipe read a second time would wait for a writer that is gone."""
    if guides is None:
        return None
    record = [[guide.prefix, list(guide.constraints)] for guide in guides]
    return hashlib.sha256(json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class GuideFiles:
    """``translate``'s side files, one line per input line: prefixes (a blank line: none) and
    constraints (JSON lists of phrases); either may be None."""

    prefix: Optional[Path] = None
    constraints: Optional[Path] = None

    def __bool__(self) -> bool:
        return self.prefix is not None or self.constraints is not None

    def name(self) -> str:
        flags = (("--prefix-file", self.prefix), ("--constraints", self.constraints))
        return " and ".join(f"{flag} {path}" for flag, path in flags if path is not None)

    def read(self, errors: str = "strict") -> Optional[list[Guide]]:
        """One Guide per line (None without files); the two files must have as many lines."""
        if not self:
            return None
        prefixes = constraints = None
        if self.prefix is not None:
            prefixes = read_lines(self.prefix, errors)
        if self.constraints is not None:
            lines = read_lines(self.constraints, errors)
            constraints = [parse_constraints(line, f"{self.constraints}: line {i}") for i, line in enumerate(lines, 1)]
        if prefixes is not None and constraints is not None and len(prefixes) != len(constraints):
            raise DataError(f"--prefix-file {self.prefix} has {len(prefixes)} lines but --constraints "
                            f"{self.constraints} has {len(constraints)}")
        count = len(prefixes if prefixes is not None else constraints)
        return [Guide.of(prefixes[i] if prefixes is not None else "", constraints[i] if constraints is not None else ())
                for i in range(count)]

    def check_count(self, guides: Optional[Sequence[Guide]], lines: int, input_name: str) -> None:
        """A one-line error unless there is one guide per input line."""
        if guides is not None and len(guides) != lines:
            raise DataError(f"{input_name} has {lines} lines but {self.name()} has {len(guides)}: "
                            "give one line per input line")

    def slice(self, guides: Optional[Sequence[Guide]], start: int, count: int) -> Optional[list[Guide]]:
        """The guides of input lines ``start`` .. ``start + count`` of a stream (None without
        guides); a one-line error when the files end before them."""
        if guides is None:
            return None
        if start + count > len(guides):
            raise DataError(f"the input has more lines than {self.name()} ({len(guides)}): "
                            "give one line per input line")
        return list(guides[start:start + count])


def target_ids(tgt_vocab, guides: Sequence[Guide]) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Per guide, its prefix pieces and its constraint phrases' pieces. A phrase is encoded
    on its own, which with SentencePiece's dummy prefix gives the pieces of the phrase as a
    word that follows a space (or starts the output); phrases that encode to nothing (only
    characters the model's normalisation removes) are dropped."""
    prefixes = tgt_vocab.encode_batch([guide.prefix for guide in guides])
    phrases = tgt_vocab.encode_batch([phrase for guide in guides for phrase in guide.constraints])
    constraints, start = [], 0
    for guide in guides:
        constraints.append([ids for ids in phrases[start:start + len(guide.constraints)] if ids])
        start += len(guide.constraints)
    return prefixes, constraints


def prefixed_text(tgt_vocab, tokens: Sequence[int], prefix: str) -> str:
    """The output text of ``tokens`` searched from ``prefix`` (its pieces forced first): the
    prefix exactly as given, so characters the vocabulary cannot spell or normalises survive,
    then the text the other pieces add. After a prefix ending in a space the next word
    starts without a second space; a prefix the length limit cut is the whole output."""
    forced = min(len(tgt_vocab.encode(prefix)), len(tokens))
    whole, head = tgt_vocab.decode(tokens), tgt_vocab.decode(tokens[:forced])
    rest = whole[len(head):] if whole.startswith(head) else " " + tgt_vocab.decode(tokens[forced:])
    if prefix[-1:].isspace() and rest.startswith(" "):
        rest = rest[1:]
    return prefix + rest
