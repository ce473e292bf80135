"""The live training line: a rich progress bar on a terminal, plain log lines elsewhere."""
from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainProgress:
    def __init__(self, console, total: int, start: int, enabled: bool = True) -> None:
        self.console, self.enabled = console, enabled and console.verbosity >= 0
        self.live = self.enabled and console.is_terminal
        self.progress = console.progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                                         TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                         TimeRemainingColumn(), disable=not self.live)
        self.task = self.progress.add_task("train", total=total, completed=start, info="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, step: int, record: dict) -> None:
        if not self.enabled:
            return
        info = (f"loss {record['loss']:.3f} ppl {record['ppl']:.1f} lr {record['lr']:.2e} "
                f"{record['tgt_tok_s']:,.0f} tok/s")
        self.progress.update(self.task, completed=step, info=info)
        if not self.live:
            self.console.print(f"step {step} epoch {record['epoch']} {info}")
