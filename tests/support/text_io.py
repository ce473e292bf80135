"""Text in and out without a terminal: a file written from lines, and consoles that print into a
string (one whose text a test reads back, one quiet)."""
from __future__ import annotations

import io
from pathlib import Path

from nmtkit.runtime.console import NmtConsole


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def recording_console() -> tuple[NmtConsole, io.StringIO]:
    """A console at the default verbosity and the text it prints, wide enough not to wrap."""
    text = io.StringIO()
    return NmtConsole(file=text, width=400), text


def quiet_console() -> NmtConsole:
    return NmtConsole(0, file=io.StringIO(), width=400)
