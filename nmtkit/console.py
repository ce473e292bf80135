"""One rich console on stderr for every command: stdout is kept for results only.

Colours follow rich's rules (off when not a terminal or when ``NO_COLOR`` is set).
Verbosity: -1 quiet (warnings and errors), 0 normal, 1 verbose.
"""
from __future__ import annotations

from typing import Any

from rich.console import Console


class NmtConsole(Console):
    def __init__(self, verbosity: int = 0, **kwargs: Any) -> None:
        super().__init__(stderr=True, highlight=False, **kwargs)
        self.verbosity = verbosity

    def info(self, *objects: Any, **kwargs: Any) -> None:
        if self.verbosity >= 0:
            self.print(*objects, **kwargs)

    def detail(self, *objects: Any, **kwargs: Any) -> None:
        if self.verbosity >= 1:
            self.print(*objects, **kwargs)

    def warn(self, message: str) -> None:
        self.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True)  # one line, whatever the width

    def progress(self, **kwargs: Any):
        """A rich Progress on this console (silent when quiet)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=self, disable=self.verbosity < 0, transient=False, **kwargs)


def get_console(verbosity: int = 0) -> NmtConsole:
    return NmtConsole(verbosity)
