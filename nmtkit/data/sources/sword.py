"""Verse-aligned pairs from two installed SWORD Bible modules (e.g. WEB English, RV1909 Spanish).

The text comes straight from the module files (zText / RawText), one entry per verse, with
no renderer in between; ``osis.osis_to_text`` strips the markup. Which entry is which
verse is the versification's business (KJV, NRSVA, ...), and its tables live inside
libsword: ``diatheke`` lists the keys of an empty stand-in module with the same
versification (a fraction of a second), and SWORD's index layout (per testament: module
heading, testament heading, then per book a book heading and per chapter a chapter
heading followed by its verses) turns that list into entry positions. The layout is
checked against the index size, so a mismatch is an error, never a silent shift of every
verse.
"""
from __future__ import annotations

import bz2
import collections
import itertools
import lzma
import math
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

from nmtkit.config import SourceConfig
from nmtkit.data.sources.corpus import Corpus, Pair
from nmtkit.data.sources.osis import osis_to_text
from nmtkit.data.sources.resplit import split_rng
from nmtkit.errors import DataError
from nmtkit.storage.files import shown_path

# The Debian packages that ship the modules the quickstart recipe uses.
DEBIAN_PACKAGES = {"engWEB2015eb": "sword-text-web", "spaRV1909eb": "sword-text-sparv",
                   "engKJV2006eb": "sword-text-kjv"}

Ref = tuple[str, int, int]  # (book name as diatheke prints it, chapter, verse)


def fingerprint(data) -> dict:
    """The config fields and module versions a fetch depends on. The stamp's JSON sorts the
    modules by name, which loses which one is the source: when the source sorts after the
    target it is named as well (so the usual order keeps the stamps it always had)."""
    mods = {}
    for name in (data.sword_src, data.sword_tgt):
        conf_path = _conf_path(Path(data.sword_path), name)
        conf = _parse_conf(conf_path) if conf_path else {}
        mods[name] = {key: conf.get(key, "") for key in ("Version", "SwordVersionDate", "Versification")}
    found = {"sword_path": data.sword_path, "modules": mods, "dev_size": data.dev_size, "test_size": data.test_size}
    if data.sword_src > data.sword_tgt:
        found["source_module"] = data.sword_src
    return found if data.sword_testament == "all" else {**found, "testament": data.sword_testament}


def read(data: SourceConfig, split_seed: int = 0) -> Corpus:
    """Align the two modules verse by verse and hold out dev and test verses from every book:
    evenly spread (split 0), or drawn at random by ``split_seed``."""
    refs, pairs, dropped, modules = aligned_verses(Path(data.sword_path), data.sword_src, data.sword_tgt)
    refs, pairs = testament(refs, pairs, data.sword_testament)
    book_sizes = [len(list(group)) for _, group in itertools.groupby(ref[0] for ref in refs)]
    dev_idx, test_idx = heldout_indices(book_sizes, data.dev_size, data.test_size, split_seed)
    held = set(dev_idx) | set(test_idx)
    train = [pair for i, pair in enumerate(pairs) if i not in held]
    provenance = {
        "modules": {"src": modules[0], "tgt": modules[1]},
        "aligned_verses": len(pairs),
        "dropped_verses": dropped,
        "heldout": ("evenly spaced verses" if not split_seed else f"verses drawn at random (split seed {split_seed})")
                   + ", a share of every book proportional to its size (at least one), dev and test alternating",
        "books": {"dev": len({refs[i][0] for i in dev_idx}), "test": len({refs[i][0] for i in test_idx})},
        "dev_refs": [ref_text(refs[i]) for i in dev_idx],
        "test_refs": [ref_text(refs[i]) for i in test_idx],
    }
    return Corpus(train=train, dev=[pairs[i] for i in dev_idx], test=[pairs[i] for i in test_idx],
                  provenance=provenance, train_size=len(train))


NEW_TESTAMENT_STARTS = "Matthew"  # the first book of the New Testament in every SWORD versification


def testament(refs: list[Ref], pairs: list[Pair], which: str) -> tuple[list[Ref], list[Pair]]:
    """The verses of the old testament (the books before Matthew), the new one, or all."""
    if which == "all":
        return refs, pairs
    start = next((i for i, ref in enumerate(refs) if ref[0] == NEW_TESTAMENT_STARTS), None)
    if start is None:
        raise DataError(f"data.sword_testament={which}: no verse of {NEW_TESTAMENT_STARTS} in both modules, so "
                        f"the testaments cannot be told apart")
    return (refs[:start], pairs[:start]) if which == "old" else (refs[start:], pairs[start:])


def ref_text(ref: Ref) -> str:
    return f"{ref[0]} {ref[1]}:{ref[2]}"


def aligned_verses(sword_path: Path, src: str, tgt: str) -> tuple[list[Ref], list[Pair], dict, tuple[dict, dict]]:
    """Pairs of verses present and non-empty in both modules, in the source module's order.

    Returns (refs, pairs, dropped counts by reason, (src module info, tgt module info)).
    A verse is dropped when it is missing from one versification, empty on one side, one
    module stores it merged with a neighbour (a "linked" verse range), or its chapter is
    numbered one verse apart in the two modules ("shifted", see ``shifted_chapters``).
    """
    src_mod, tgt_mod = SwordModule(sword_path, src), SwordModule(sword_path, tgt)
    src_verses, tgt_verses = read_verse_texts([src_mod, tgt_mod])
    dropped = dict(missing_src=0, missing_tgt=0, empty_src=0, empty_tgt=0, linked=0, shifted=0)
    refs, pairs = [], []
    for ref, src_text in src_verses.items():
        tgt_text = tgt_verses.get(ref)
        if tgt_text is None:
            dropped["missing_tgt"] += 1
        elif src_text is _LINKED or tgt_text is _LINKED:
            dropped["linked"] += 1
        elif not src_text:
            dropped["empty_src"] += 1
        elif not tgt_text:
            dropped["empty_tgt"] += 1
        else:
            refs.append(ref)
            pairs.append((src_text, tgt_text))
    dropped["missing_src"] = sum(1 for ref in tgt_verses if ref not in src_verses)
    shifted = shifted_chapters(refs, pairs)
    keep = [i for i, ref in enumerate(refs) if ref[:2] not in shifted]
    dropped["shifted"] = len(refs) - len(keep)
    refs, pairs = [refs[i] for i in keep], [pairs[i] for i in keep]
    return refs, pairs, dropped, (src_mod.info(), tgt_mod.info())


def shifted_chapters(refs: list[Ref], pairs: list[Pair], min_verses: int = 3) -> set[tuple[str, int]]:
    """Chapters whose verses are numbered one apart in the two modules.

    Both modules are indexed by an English versification, but a text keeps its own
    tradition in places (the RV1909 starts Numbers 13 a verse early, as Spanish Bibles
    do). In such a chapter the length ratio of each verse fits the neighbouring verse of
    the other side far better than its own: the mean distance of log(len src / len tgt)
    from the corpus median is then under 0.6 of the unshifted one, which itself is high
    (over 0.25, where an aligned chapter scores about 0.1).
    """
    log_ratios = sorted(math.log(len(src) / len(tgt)) for src, tgt in pairs)
    centre = log_ratios[len(log_ratios) // 2] if log_ratios else 0.0
    chapters: dict[tuple[str, int], list[Pair]] = {}
    for ref, pair in zip(refs, pairs):
        chapters.setdefault(ref[:2], []).append(pair)
    shifted = set()
    for chapter, chapter_pairs in chapters.items():
        if len(chapter_pairs) < min_verses:
            continue
        src_lens, tgt_lens = [len(p[0]) for p in chapter_pairs], [len(p[1]) for p in chapter_pairs]

        def cost(offset: int) -> float:
            pairs_at = [(s, tgt_lens[i + offset]) for i, s in enumerate(src_lens) if 0 <= i + offset < len(tgt_lens)]
            return sum(abs(math.log(s / t) - centre) for s, t in pairs_at) / len(pairs_at)

        unshifted = cost(0)
        if unshifted > 0.25 and min(cost(1), cost(-1)) < 0.6 * unshifted:
            shifted.add(chapter)
    return shifted


def heldout_indices(book_sizes: list[int], dev_size: int, test_size: int,
                    split_seed: int = 0) -> tuple[list[int], list[int]]:
    """Positions of dev and test items among consecutive books of ``book_sizes`` items.

    Every book gets a share proportional to its size, and at least one item when there
    are enough to go round; within a book the picks are evenly spaced (split 0) or drawn
    at random by ``split_seed`` (another split: the same shares, other verses); dev and
    test then alternate along the picks. Positions depend only on the sizes and the split
    seed, so every run agrees.
    """
    n, total = sum(book_sizes), dev_size + test_size
    if dev_size < 0 or test_size < 0 or total >= n:
        raise DataError(f"data.dev_size + data.test_size = {total} leaves no training verses out of {n}")
    quotas = _quotas(book_sizes, total)
    picks, start = [], 0
    rng = split_rng(split_seed) if split_seed else None
    for size, quota in zip(book_sizes, quotas):
        if rng is None:
            picks += [start + (2 * i + 1) * size // (2 * quota) for i in range(quota)]  # centre of each slice
        else:
            picks += [start + i for i in sorted(rng.sample(range(size), quota))]
        start += size
    dev, test = [], []
    for i, pos in enumerate(picks):
        # Bresenham-style interleave: dev gets exactly dev_size of the picks, evenly
        (dev if (i + 1) * dev_size // total > i * dev_size // total else test).append(pos)
    return dev, test


def _quotas(sizes: list[int], total: int) -> list[int]:
    """Split ``total`` over ``sizes`` proportionally (largest remainder), no book left at 0."""
    n = sum(sizes)
    shares = [total * size / n for size in sizes]
    quotas = [int(share) for share in shares]
    by_remainder = sorted(range(len(sizes)), key=lambda b: quotas[b] - shares[b])
    for b in by_remainder[:total - sum(quotas)]:
        quotas[b] += 1
    for b in range(len(sizes)):
        donor = max(range(len(sizes)), key=lambda d: quotas[d])
        if quotas[b] == 0 and sizes[b] and quotas[donor] > 1:
            quotas[b], quotas[donor] = 1, quotas[donor] - 1
    return quotas


class SwordModule:
    """One installed module: its .conf settings and raw verse entries by index."""

    def __init__(self, sword_path: Path, name: str, setting: str = "data.sword_path") -> None:
        self.name = name
        self.sword_path = sword_path
        conf_path = _conf_path(sword_path, name)
        if conf_path is None:
            package = DEBIAN_PACKAGES.get(name)
            hint = f"install the Debian package {package}" if package else "install it with your SWORD installer"
            raise DataError(f"SWORD module {name} not found under {shown_path(sword_path / 'mods.d', setting)}"
                            f" ({hint}, or set {setting})")
        self.conf = _parse_conf(conf_path)
        driver = self.conf.get("ModDrv", "")
        if driver not in _INDEX_FORMATS:
            raise DataError(f"SWORD module {name}: driver {driver or '(none)'} is not supported "
                            f"(supported: {', '.join(_INDEX_FORMATS)})")
        if self.conf.get("CipherKey"):
            raise DataError(f"SWORD module {name} is encrypted (CipherKey); unlock it first")
        if self.conf.get("SourceType", "OSIS").upper() != "OSIS":
            raise DataError(f"SWORD module {name}: only OSIS markup is supported, not {self.conf['SourceType']}")
        self.data_dir = (sword_path / self.conf.get("DataPath", "")).resolve()
        if not self.data_dir.is_dir():
            raise DataError(f"SWORD module {name}: data directory {self.data_dir} is missing (reinstall the module)")

    def info(self) -> dict:
        keys = ("Description", "Version", "SwordVersionDate", "Versification", "Lang")
        return {"name": self.name, **{key.lower(): self.conf.get(key, "") for key in keys}}

    def entries(self, testament: str) -> list[bytes | None]:
        """Raw entries of one testament ("ot"/"nt") by index; None marks linked verses."""
        record_fmt, compressed = _INDEX_FORMATS[self.conf["ModDrv"]]
        index_path = self.data_dir / f"{testament}.{'bzv' if compressed else 'vss'}"
        if not index_path.is_file():
            return []
        try:
            index = index_path.read_bytes()
            if compressed:
                blocks = _read_blocks(self.data_dir / f"{testament}.bzs", self.data_dir / f"{testament}.bzz",
                                      self.conf.get("CompressType", "ZIP"), self.name)
            else:
                blocks = [(self.data_dir / testament).read_bytes()]
            step, records = struct.calcsize(record_fmt), []
            for pos in range(0, len(index) - step + 1, step):
                record = struct.unpack_from(record_fmt, index, pos)
                records.append(record if compressed else (0, *record))  # (block, offset, size)
            # two verses pointing at one text are a merged range: neither alone matches the other side
            shared = collections.Counter(record for record in records if record[2])
            if any(offset + size > len(blocks[block]) for block, offset, size in records):
                raise IndexError("an entry points past the end of its text")
            return [None if shared[record] > 1 else blocks[record[0]][record[1]:record[1] + record[2]]
                    for record in records]
        except (OSError, IndexError, struct.error, zlib.error, lzma.LZMAError) as err:
            raise DataError(f"SWORD module {self.name} is damaged ({testament} index: {err}); reinstall it") from None

    def versification(self) -> str:
        return self.conf.get("Versification", "KJV")

    def encoding(self) -> str:
        return "utf-8" if self.conf.get("Encoding", "").upper().replace("-", "") == "UTF8" else "latin-1"


# ModDrv -> (index record struct, compressed). Compressed records: block, offset, size.
_INDEX_FORMATS = {"zText": ("<IIH", True), "zText4": ("<III", True), "RawText": ("<IH", False),
                  "RawText4": ("<II", False)}
_LINKED = object()  # marks a verse whose text is stored under its neighbour


def _read_blocks(bzs: Path, bzz: Path, compress: str, name: str) -> list[bytes]:
    decompress = {"ZIP": zlib.decompress, "BZIP2": bz2.decompress, "XZ": lzma.decompress}.get(compress.upper())
    if decompress is None:
        raise DataError(f"SWORD module {name}: compression {compress} is not supported (ZIP, BZIP2, XZ)")
    table, data = bzs.read_bytes(), bzz.read_bytes()
    blocks = []
    for pos in range(0, len(table) - 11, 12):
        offset, size, _ = struct.unpack_from("<III", table, pos)
        blocks.append(decompress(data[offset:offset + size]))
    return blocks


def _conf_path(sword_path: Path, name: str) -> Path | None:
    mods = sword_path / "mods.d"
    if not mods.is_dir():
        return None
    for path in sorted(mods.glob("*.conf")):
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = next((line.strip() for line in handle if line.strip() and not line.startswith("#")), "")
        if first.lower() == f"[{name.lower()}]":
            return path
    return None


def _parse_conf(path: Path) -> dict:
    conf: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            conf.setdefault(key.strip(), value.strip())
    return conf


# --- which entry is which verse ----------------------------------------------------------------

_KEY = re.compile(r"^(.*\S) (\d+):(\d+):")


def read_verse_texts(modules: list[SwordModule]) -> list[dict[Ref, str | object]]:
    """For each module, {ref: plain text} in index order (``_LINKED`` for merged verses)."""
    return [_verse_texts(module, versification_keys(module.versification())) for module in modules]


def module_texts(sword_path: Path, name: str, setting: str) -> tuple[SwordModule, dict[Ref, str | None]]:
    """One module and its verses by reference in index order: plain text, or None where the
    module stores the verse merged with a neighbour (a linked range). ``setting`` names where
    ``sword_path`` came from, for the error when the module is missing."""
    module = SwordModule(sword_path, name, setting)
    (texts,) = read_verse_texts([module])
    return module, {ref: None if text is _LINKED else text for ref, text in texts.items()}


def versification_keys(versification: str) -> list[Ref]:
    """Every verse key of a versification, in index order.

    The tables live inside libsword, so we ask diatheke to list a stand-in module that has
    this versification and no text: that lists 37k keys in a fraction of a second, where
    rendering a real module takes seconds.
    """
    diatheke = shutil.which("diatheke")
    if diatheke is None:
        raise DataError("diatheke not found (install the Debian package diatheke)")
    with tempfile.TemporaryDirectory(prefix="nmtkit-sword-") as tmp:
        root = Path(tmp)
        (root / "mods.d").mkdir()
        (root / "empty").mkdir()
        for name in ("ot", "nt", "ot.vss", "nt.vss"):
            (root / "empty" / name).touch()
        (root / "mods.d" / "nmtkitkeys.conf").write_text(
            f"[NmtkitKeys]\nDataPath=./empty/\nModDrv=RawText\nSourceType=OSIS\nEncoding=UTF-8\n"
            f"Versification={versification}\n", encoding="utf-8")
        env = {**os.environ, "SWORD_PATH": tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        proc = subprocess.run([diatheke, "-b", "NmtkitKeys", "-f", "plain", "-l", "en", "-k", "Gen-Rev"],
                              capture_output=True, env=env, check=False)
    if proc.returncode != 0:
        raise DataError(f"diatheke failed listing the {versification} versification: "
                        f"{proc.stderr.decode(errors='replace').strip()[:200]}")
    keys: list[Ref] = []
    for line in proc.stdout.decode("utf-8", errors="replace").splitlines():
        match = _KEY.match(line)
        if match:
            ref = (match.group(1), int(match.group(2)), int(match.group(3)))
            if keys and not _follows(keys[-1], ref):
                raise DataError(f"unexpected verse order in the {versification} versification "
                                f"({ref_text(keys[-1])} then {ref_text(ref)})")
            keys.append(ref)
    if not keys:
        raise DataError(f"diatheke listed no verses for the {versification} versification")
    return keys


def _follows(prev: Ref, ref: Ref) -> bool:
    if prev[0] != ref[0]:
        return ref[1:] == (1, 1)
    return ref[1:] in ((prev[1], prev[2] + 1), (prev[1] + 1, 1))


def _verse_texts(module: SwordModule, keys: list[Ref]) -> dict[Ref, str | object]:
    """Map versification keys onto index entries and strip each entry's markup."""
    entries = {testament: module.entries(testament) for testament in ("ot", "nt")}
    positions = _layout(keys, [len(entries["ot"]), len(entries["nt"])], module)
    texts: dict[Ref, str | object] = {}
    encoding, lang = module.encoding(), module.conf.get("Lang", "")
    for testament, refs in zip(("ot", "nt"), positions):
        for ref, pos in refs:
            raw = entries[testament][pos]
            texts[ref] = _LINKED if raw is None else osis_to_text(raw.decode(encoding, errors="replace"), lang)
    return texts


def _layout(keys: list[Ref], sizes: list[int], module: SwordModule) -> list[list[tuple[Ref, int]]]:
    """Entry position of every key in its testament's index (``sizes``: entries in ot, nt)."""
    testaments: list[list[tuple[Ref, int]]] = [[], []]
    counts = [2, 2]  # each testament index starts with a module heading and a testament heading
    testament, book, chapter = 0, None, None
    for ref in keys:
        if ref[0] != book:
            testament = 1 if ref[0] == _FIRST_NT_BOOK else testament
            counts[testament] += 1  # book heading
            book, chapter = ref[0], None
        if ref[1] != chapter:
            counts[testament] += 1  # chapter heading
            chapter = ref[1]
        testaments[testament].append((ref, counts[testament]))
        counts[testament] += 1
    for i, name in enumerate(("old", "new")):
        if sizes[i] and sizes[i] != counts[i]:
            raise DataError(f"SWORD module {module.name}: its {name} testament index has {sizes[i]} entries but the "
                            f"{module.versification()} versification needs {counts[i]}; "
                            f"cannot align its verses")
        if not sizes[i]:
            testaments[i] = []  # the module does not have this testament
    return testaments


_FIRST_NT_BOOK = "Matthew"  # every SWORD versification starts the new testament here (English names: -l en)
