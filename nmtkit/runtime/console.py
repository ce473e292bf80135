"""One rich console on stderr for every command: stdout is kept for results only.

Colours follow rich's rules (off when not a terminal or when ``NO_COLOR`` is set).
Verbosity: -1 quiet (warnings and errors), 0 normal, 1 verbose.

rich itself is imported at the first output, not when the console is made: ``nmtkit
translate`` on an idle machine prints nothing to stderr, and importing rich would cost it
about 0.02 s before its first line.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

if TYPE_CHECKING:
    from rich.console import Console


class NmtConsole:
    """nmtkit's messages (info, detail, warn, progress bars) over a rich ``Console`` on stderr,
    made on first use from ``kwargs``; every other Console attribute (``print``,
    ``is_terminal``, ``status``, ...) is the rich console's own."""

    def __init__(self, verbosity: int = 0, **kwargs: Any) -> None:
        self.verbosity = verbosity
        self._kwargs = kwargs
        self._rich: Optional[Console] = None

    @property
    def rich(self) -> "Console":
        if self._rich is None:
            from rich.console import Console

            self._rich = Console(stderr=True, highlight=False, **self._kwargs)
        return self._rich

    def __getattr__(self, name: str) -> Any:  # only for names this class does not define
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.rich, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """A rich console's own setting (``quiet``, which silences other ranks) goes to the rich
        console, as it did when this class was one; anything else stays here."""
        if name in ("verbosity", "_kwargs", "_rich") or hasattr(type(self), name) or not hasattr(self.rich, name):
            object.__setattr__(self, name, value)
        else:
            setattr(self.rich, name, value)

    def info(self, *objects: Any, **kwargs: Any) -> None:
        if self.verbosity >= 0:
            self.print(*objects, **kwargs)

    def detail(self, *objects: Any, **kwargs: Any) -> None:
        if self.verbosity >= 1:
            self.print(*objects, **kwargs)

    def rule(self, *args: Any, **kwargs: Any) -> None:
        """A section heading (hidden when quiet)."""
        if self.verbosity >= 0:
            self.rich.rule(*args, **kwargs)

    def warn(self, message: str) -> None:
        """``message`` as one line, whatever the width, shown as the plain text every caller
        passes: a warning quotes names and values from files (metadata, manifests), and a
        newline there must not split it, nor a ``[/x]`` in it be taken for rich markup."""
        from rich.markup import escape

        self.print(f"[yellow]warning:[/yellow] {escape(one_line(message))}", soft_wrap=True, emoji=False)

    def progress(self, *columns: Any, **kwargs: Any):
        """The one place a rich Progress is made: on this console, silent when quiet (unless
        ``disable`` says otherwise), with ``columns`` or description, bar, count and times."""
        from rich.progress import Progress

        kwargs.setdefault("disable", self.verbosity < 0)
        return Progress(*(columns or _columns()), console=self.rich, transient=False, **kwargs)

    @contextlib.contextmanager
    def terminal_bar(self, description: str, total: Optional[int], unit: Optional[str] = None,
                     completed: int = 0) -> Iterator[Callable[[int], None]]:
        """A progress bar (a pulsing one when ``total`` is None) for a person watching a
        terminal, nothing in a log file; yields ``advance(n)``. With ``unit`` it also shows the
        rate ("120 lines/s"); ``completed`` is work done before (by an earlier run): it fills the
        bar but does not count towards the rate or the time left."""
        if not self.is_terminal:
            yield lambda n: None
            return
        progress = self.progress(*_columns(unit))
        progress.start()
        task = progress.add_task(description, total=total, completed=completed)
        try:
            yield lambda n: progress.advance(task, n)
        except BaseException:
            progress.live.transient = True  # the error is reported alone, without a half-drawn bar
            progress.live.stop()
            raise
        if total is None:
            progress.update(task, total=1, completed=1)
        progress.stop()


def one_line(message: str) -> str:
    """``message`` with its control characters (a newline, a carriage return, an escape) shown
    escaped (\\n, \\r, \\x1b), not written."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in message)


def _columns(unit: Optional[str] = None) -> tuple:
    """Description, bar, count, (rate in ``unit``/s,) elapsed and remaining time."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    rate = () if unit is None else (_rate_column(unit),)
    return (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *rate, TimeElapsedColumn(),
            TimeRemainingColumn())


def _rate_column(unit: str):
    """A column showing "N unit/s" (rich's own speed columns count bytes or iterations)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{speed:,.0f} {unit}/s")

    return Rate()


def get_console(verbosity: int = 0) -> NmtConsole:
    return NmtConsole(verbosity)
