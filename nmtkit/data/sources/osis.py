"""OSIS markup of one SWORD verse entry to plain text.

Notes, section headings, speakers, variant readings and non-scripture divisions
(introductions, the glossary after Revelation) are dropped; canonical titles (psalm
superscriptions) are kept as verse text. Where markup was removed between two words a
space is put back: the WEB writes ``God</w><w>created`` and
``rock</w></q><note>..</note><q><w>I`` where its printed text has a space.
"""
from __future__ import annotations

import html
import re

_TOKEN = re.compile(r"<(/?)([A-Za-z][\w:.-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*?)(/?)>|([^<]+)")
_NOTE = re.compile(r"<note\b[^>]*(?<!/)>.*?</note>", re.S)
# Removed markup leaves a gap marker (a private-use character); _close_gap decides whether
# it becomes a space. The WEB writes `God</w><note>..</note><w>created` and
# `Peter</w>,</q><note>..</note><q><w>and`: the source had a space where the note sits.
_GAP = "\ue000"
_GAPS = re.compile(_GAP + "+")
_OPENING = set("([{“‘«¿¡—–-/") | {_GAP}
_CLOSING = set(".,;:!?)]}”’»…—–-/") | {_GAP}
# <w> tags carry only lemma/morphology attributes; the end of a word (or of an added-words
# or quotation span) is a gap, since the modules write `God</w><w>created`,
# `allí</w><transChange>también</transChange><w>bdelio` and `fringes</q><q><w>of`.
_W_OPEN = re.compile(r"<w\b[^>]*>")
_ENCLITIC = {"es": re.compile(r"</w>(?=<transChange\b[^>]*>(?:lo|la|los|las|le|les|me|te|se|nos|os)</transChange>)")}
_WORD_SPANS = {"transChange", "q", "divineName", "name", "foreign", "hi", "seg"}
_ATTR = re.compile(r"""([\w:.-]+)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
# Elements whose content is not verse text.
_DROP = {"note", "title", "speaker", "head", "catchWord", "rdg", "figure", "index"}
# Elements that separate words (line and paragraph structure).
_BREAK = {"l", "lg", "lb", "p", "div", "item", "list", "milestone", "chapter", "verse", "table", "row", "cell"}
# OSIS division types that hold scripture; any other division (introduction, glossary, ...) is dropped.
_SCRIPTURE_DIVS = {"", "book", "bookGroup", "chapter", "section", "subSection", "majorSection", "paragraph",
                   "part", "body", "bridge"}


def osis_to_text(markup: str, lang: str = "") -> str:
    """Plain text of one verse entry: markup, notes and headings removed, whitespace normalised.

    ``lang`` (the module's language code) keeps enclitic pronouns that a translator added
    in a separate span attached to their verb: the RV1909 writes
    ``háce</w><transChange>lo</transChange>`` for "hácelo".
    """
    markup = _NOTE.sub(_GAP, markup)  # notes never nest, so a lazy match is exact (and fast)
    if lang in _ENCLITIC:
        markup = _ENCLITIC[lang].sub("", markup)
    markup = _W_OPEN.sub("", markup).replace("</w>", _GAP)
    out: list[str] = []
    stack: list[tuple[str, bool]] = []  # open container elements and whether they drop content
    dropping_ids: set[str] = set()  # sIDs of open milestone-style divisions that drop content
    dropping = 0  # open containers that drop content
    for match in _TOKEN.finditer(markup):
        closing, name, attr_text, empty, text = match.groups()
        if text is not None:
            if not dropping and not dropping_ids:
                out.append(html.unescape(text))
            continue
        attrs = _attrs(attr_text) if name in ("div", "title") else {}
        if name in _BREAK:
            out.append(" ")
        if name == "div":
            if attrs.get("type") == "book" and "eID" in attrs:
                break  # end of the book: what follows (glossary, appendices) is not this verse
            if "eID" in attrs:
                dropping_ids.discard(attrs["eID"])
            elif "sID" in attrs and not _is_scripture_div(attrs):
                dropping_ids.add(attrs["sID"])
        if empty:
            continue
        if closing:
            if name in _WORD_SPANS:  # its start may be in an earlier verse: no need to find it
                out.append(_GAP)
            while stack:
                open_name, drop = stack.pop()
                dropping -= drop
                if drop and not dropping:
                    out.append(_GAP)
                if open_name == name:
                    break
            continue
        drop = (name in _DROP and not (name == "title" and attrs.get("canonical") == "true")) or (
            name == "div" and not _is_scripture_div(attrs))
        stack.append((name, drop))
        dropping += drop
    return " ".join(_GAPS.sub(_close_gap, "".join(out)).split())


def _close_gap(match: re.Match) -> str:
    """Where markup was removed, words on both sides need a space; punctuation does not."""
    text, start, end = match.string, match.start(), match.end()
    before = text[start - 1] if start else " "
    after = text[end] if end < len(text) else " "
    if before.isspace() or after.isspace() or before in _OPENING or after in _CLOSING:
        return ""
    return " "


def _attrs(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3) for m in _ATTR.finditer(text)}


def _is_scripture_div(attrs: dict) -> bool:
    kind = attrs.get("type", "")
    return kind in _SCRIPTURE_DIVS or kind.startswith("x-")
