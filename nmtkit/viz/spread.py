"""The spread of a replicated sweep (seeds x data splits): per variant, the mean of its runs'
training loss, dev loss and dev BLEU at each step with error bars of one standard deviation,
and its test BLEU (mean ± standard deviation, every run a dot), so a difference between two
variants can be read against the variation within each."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from nmtkit.errors import ConfigError
from nmtkit.runlog import read_metrics
from nmtkit.viz.curves import X_AXES, run_styles, series
from nmtkit.viz.figure import check_image_path, new_figure, save_figure

PANELS = (("train", "loss", "training loss"), ("valid", "dev_loss", "dev loss"), ("valid", "dev_bleu", "dev BLEU"))


def mean_and_std(runs: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float], list[float]]:
    """(x, mean, standard deviation) at the x values every run has (0 where one run has it)."""
    common = sorted(set.intersection(*(set(xs) for xs, _ in runs))) if runs else []
    values = [[dict(zip(xs, ys))[x] for xs, ys in runs] for x in common]
    return (common, [statistics.fmean(v) for v in values],
            [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values])


def plot_spread(groups: Sequence[tuple[str, Sequence[Path], Sequence[float]]], out: str | Path, x: str = "step",
                size: tuple[int, int] = (1200, 800)) -> Path:
    """``groups``: (variant, its runs' training directories, its runs' test BLEU scores)."""
    if x not in X_AXES:
        raise ConfigError(f"--x {x!r}: expected one of {', '.join(X_AXES)}")
    check_image_path(out)
    fig = new_figure(*size)
    axes = list(fig.subplots(2, 2).ravel())
    styles = run_styles(len(groups))
    for index, ((label, run_dirs, bleus), (color, line)) in enumerate(zip(groups, styles)):
        records = [read_metrics(d) for d in run_dirs]
        for ax, (kind, field, _) in zip(axes, PANELS):
            # runs are aligned by step; with --x time a step sits at the runs' mean training time
            xs, mean, std = mean_and_std([series(r, kind, field, "step") for r in records])
            if x == "time" and xs:
                clocks = [dict(zip(steps, times)) for steps, (times, _) in
                          ((series(r, kind, field, "step")[0], series(r, kind, field, "time")) for r in records)]
                xs = [statistics.fmean(clock[step] for clock in clocks) for step in xs]
            if xs:
                ax.errorbar(xs, mean, yerr=std, color=color, linestyle=line, label=label, capsize=2, linewidth=1.2,
                            marker="o" if kind == "valid" else None, markersize=3)
        if bleus:
            axes[3].errorbar([index], [statistics.fmean(bleus)], yerr=[statistics.stdev(bleus) if len(bleus) > 1 else 0],
                             color=color, marker="s", capsize=4, label=label)
            axes[3].scatter([index] * len(bleus), bleus, color=color, s=10, alpha=0.6)
    for ax, (_, field, title) in zip(axes, PANELS):
        ax.set_title(f"{title} (mean ± sd over runs)")
        ax.set_xlabel("update steps" if x == "step" else "training time (seconds)")
        ax.grid(alpha=0.3)
    axes[3].set_title("test BLEU (mean ± sd; dots: runs)")
    axes[3].set_xticks(range(len(groups)), [label for label, _, _ in groups], rotation=30, ha="right")
    axes[3].grid(alpha=0.3)
    handles, labels = next((ax.get_legend_handles_labels() for ax in axes if ax.get_legend_handles_labels()[0]),
                           ([], []))
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 4), frameon=False)
    return save_figure(fig, out)
