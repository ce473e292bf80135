"""Monolingual text from an installed SWORD Bible, one verse a line: the input of
back-translation on the offline corpus (``nmtkit verses``).

Another translation of the Bible restates the dev and test verses of a parallel corpus in
other words, so training on it would leak their meaning; the verses a prepared directory holds
out (its manifest's ``dev_refs`` / ``test_refs``, of every corpus) are left out by reference.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from nmtkit.data.ids import prepared_file
from nmtkit.data.sources import sword
from nmtkit.errors import ConfigError, DataError
from nmtkit.storage.files import read_json_dict
from nmtkit.storage.outputs import check_output_file, open_output, same_file


def heldout_refs(prepared: Path) -> tuple[set[str], set[str]]:
    """The held-out verse references of a prepared directory, and the versifications they use.
    The manifest is verified against the directory's checksums.json first and its fields
    checked: a reference edited or of the wrong type would let a held-out verse into the
    text, silently."""
    path = Path(prepared) / "manifest.json"
    if not os.path.lexists(path):
        raise ConfigError(f"--exclude {prepared}: no manifest.json there (give a prepared/ directory "
                          f"of a recipe with a sword source)")
    manifest = read_json_dict(prepared_file(path))
    if manifest is None:
        raise DataError(f"{path}: not a manifest nmtkit wrote (unreadable, or not a JSON object)")
    provenance = manifest.get("provenance") or {}
    if not isinstance(provenance, dict):
        raise DataError(f"{path}: provenance must be a mapping, got {type(provenance).__name__}")
    # one corpus: its provenance; several: {corpus name: provenance}
    found = [provenance] if "dev_refs" in provenance else [p for p in provenance.values() if isinstance(p, dict)]
    found = [p for p in found if "dev_refs" in p]
    if not found:
        raise ConfigError(f"--exclude {prepared}: its data has no sword corpus, so no verse references to leave out")
    for corpus in found:
        for key in ("dev_refs", "test_refs"):
            refs = corpus.get(key, [])
            if not isinstance(refs, list) or not all(isinstance(ref, str) for ref in refs):
                raise DataError(f"{path}: {key} must be a list of verse references (text), got "
                                f"{str(refs)[:80]}")
    refs = {ref for p in found for key in ("dev_refs", "test_refs") for ref in p.get(key, [])}
    systems = {_versification(p) for p in found}
    return refs, systems - {""}


def _versification(corpus: dict) -> str:
    modules = corpus.get("modules")
    src = modules.get("src") if isinstance(modules, dict) else None
    system = src.get("versification", "") if isinstance(src, dict) else ""
    return system if isinstance(system, str) else ""


def module_verses(sword_path: Path, name: str, testament: str = "all") -> tuple[list[sword.Ref], list[str], dict]:
    """The non-empty verses of one module in its index order, and a report: its versification
    and how many verses were left out why."""
    module, texts = sword.module_texts(sword_path, name, "--sword-path")
    # the testament first, so the report counts the verses of the testament asked for
    chosen, texts = sword.testament(list(texts), list(texts.values()), testament)
    refs, lines, dropped = [], [], {"empty": 0, "linked": 0}
    for ref, text in zip(chosen, texts):
        if text is None:
            dropped["linked"] += 1
        elif not text:
            dropped["empty"] += 1
        else:
            refs.append(ref)
            lines.append(text)
    return refs, lines, {"module": name, "versification": module.versification(), "dropped": dropped}


def select_verses(sword_path: Path, name: str, exclude: list[Path], testament: str = "all") -> tuple[list[str], list[str], dict]:
    """(references, texts, report) of the verses of ``name`` outside every held-out set of ``exclude``."""
    refs, lines, report = module_verses(sword_path, name, testament)
    held: set[str] = set()
    notes = []
    for prepared in exclude:
        found, systems = heldout_refs(prepared)
        held |= found
        if systems and systems != {report["versification"]}:
            notes.append(f"{prepared} numbers its verses in the {'/'.join(sorted(systems))} versification and "
                         f"{name} in {report['versification']}: references are matched by book, chapter and "
                         f"verse, which name different verses in a few places")
    keep = [i for i, ref in enumerate(refs) if sword.ref_text(ref) not in held]
    report.update(verses=len(refs), written=len(keep), excluded=len(refs) - len(keep), notes=notes)
    return [sword.ref_text(refs[i]) for i in keep], [lines[i] for i in keep], report


def export_verses(name: str, output: str | None, exclude: list[Path], testament: str = "all",
                  sword_path: Path = Path("/usr/share/sword"), refs_output: str | None = None) -> dict:
    """Write the selected verses one a line to ``output`` (None or "-": stdout), and their
    references line by line to ``refs_output`` ("-": stdout, when the verses go to a file); both
    checked before the module is read, written atomically."""
    if testament not in ("all", "old", "new"):
        raise ConfigError(f"--testament {testament}: choose all, old or new")
    out = check_output_file(None if output == "-" else output)  # "-": stdout, as for translate
    if refs_output == "-" and out is None:  # one stream cannot carry both, line by line
        raise ConfigError("--refs -: the verses already go to stdout; give -o FILE, or --refs FILE")
    refs_out = check_output_file(None if refs_output == "-" else refs_output, "--refs")
    if out is not None and refs_out is not None and same_file(out, refs_out):
        raise ConfigError(f"--refs {refs_output} is the file -o writes the verses to; give each its own file")
    for prepared in exclude:
        heldout_refs(prepared)  # a wrong --exclude fails before the seconds of reading the module
    refs, lines, report = select_verses(Path(sword_path), name, exclude, testament)
    for path, rows, wanted in ((refs_out, refs, refs_output is not None), (out, lines, True)):
        text = "".join(row + "\n" for row in rows).encode("utf-8")
        if path is not None:
            with open_output(path) as handle:
                handle.write(text)
        elif wanted:
            sys.stdout.buffer.write(text)
            sys.stdout.flush()
    return report
