"""Training curves: training loss, dev loss, dev BLEU and learning rate against update
steps or training wall time, several runs overlaid (one colour per run).

The data is ``RUN_DIR/metrics.jsonl``, the trainer's record of a run: ``train`` lines carry
``step``, ``loss``, ``lr`` and ``train_seconds``; ``valid`` lines carry ``step``,
``dev_loss`` and (with BLEU validation) ``dev_bleu``. Validation lines have no clock of
their own: their time is interpolated from the training lines around them. Runs of
Mixture-of-Experts models add two panels, one line per MoE layer: the load-balancing loss
(``moe_aux_layers``, 1 = uniform routing) and the busiest expert's share of assignments
times the number of experts (from ``moe_load``: 1 = balanced, E = every token on one expert).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from nmtkit.errors import ConfigError
from nmtkit.runlog import read_metrics
from nmtkit.viz.figure import check_image_path, new_figure, save_figure

# (record type, field, panel title)
PANELS = (("train", "loss", "training loss"), ("valid", "dev_loss", "dev loss"),
          ("valid", "dev_bleu", "dev BLEU"), ("train", "lr", "learning rate"))
# (per-layer field, panel title, layer value -> number)
MOE_PANELS = (("moe_aux_layers", "MoE load-balancing loss per layer", float),
              ("moe_load", "MoE busiest expert share x experts", lambda shares: max(shares) * len(shares)))
X_AXES = ("step", "time")


def run_labels(run_dirs: Sequence[str | Path]) -> list[str]:
    """Legend labels: each run directory's name, with as many parent folders as it takes to
    tell the runs apart (and at least one for the default name ``train``)."""
    parts = [Path(d).resolve().parts for d in run_dirs]
    labels: list[str] = []
    for extra in range(max(len(p) for p in parts)):
        labels = ["/".join(p[-((2 if p[-1] == "train" else 1) + extra):]) for p in parts]
        if len(set(labels)) == len(labels):
            break
    return labels


def _seconds_at(steps: list[int], train: list[dict]) -> list[float]:
    """Training seconds at ``steps``: linear between logged train records, extrapolated after."""
    import numpy as np

    known_steps = [0] + [r["step"] for r in train]
    known_seconds = [0.0] + [float(r["train_seconds"]) for r in train]
    rate = known_seconds[-1] / known_steps[-1] if known_steps[-1] else 0.0
    return [float(np.interp(s, known_steps, known_seconds)) if s <= known_steps[-1]
            else known_seconds[-1] + (s - known_steps[-1]) * rate for s in steps]


def series(records: list[dict], kind: str, field: str, x: str) -> tuple[list[float], list[float]]:
    """(x, y) points of one field: x in steps, or in training seconds when ``x`` is 'time'."""
    points = [r for r in records if r.get("type") == kind and isinstance(r.get(field), (int, float))]
    steps = [r["step"] for r in points]
    values = [float(r[field]) for r in points]
    if x == "step":
        return [float(s) for s in steps], values
    train = [r for r in records if r.get("type") == "train" and "train_seconds" in r]
    return _seconds_at(steps, train), values


def layer_series(records: list[dict], field: str, value, x: str) -> dict[str, tuple[list[float], list[float]]]:
    """{MoE layer: (x, y)} from a per-layer field of the train records ({layer: number or list})."""
    points = [r for r in records if r.get("type") == "train" and isinstance(r.get(field), dict)]
    xs, _ = series(points, "train", "step", x)
    out: dict[str, tuple[list[float], list[float]]] = {}
    for at, record in zip(xs, points):
        for layer, raw in record[field].items():
            try:
                point = float(value(raw))
            except (TypeError, ValueError):  # a damaged record's value: left out
                continue
            layer_xs, layer_ys = out.setdefault(layer, ([], []))
            layer_xs.append(at)
            layer_ys.append(point)
    return out


def _time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds <= 120:
        return 1.0, "seconds"
    if max_seconds <= 2 * 3600:
        return 1 / 60, "minutes"
    return 1 / 3600, "hours"


LINE_STYLES = ("-", "--", ":", "-.")


def run_styles(count: int) -> list[tuple[str, str]]:
    """(colour, line style) of each run: the ten default colours, then again dashed, dotted, ...
    so that a sweep of up to 40 runs (table3-mini has 26) tells every run apart in the legend."""
    return [(f"C{i % 10}", LINE_STYLES[(i // 10) % len(LINE_STYLES)]) for i in range(count)]


def plot_curves(run_dirs: Sequence[str | Path], out: str | Path, x: str = "step",
                size: tuple[int, int] = (1200, 800), labels: Sequence[str] | None = None) -> Path:
    """Draw the four panels (six with MoE runs) for every run into ``out`` (format from its
    suffix); the legend names each run by ``labels`` or, without them, by its directory."""
    if x not in X_AXES:
        raise ConfigError(f"--x {x!r}: expected one of {', '.join(X_AXES)}")
    if not run_dirs:
        raise ConfigError("no run directory given")
    check_image_path(out)  # before reading anything
    runs = [(label, read_metrics(d)) for label, d in zip(labels or run_labels(run_dirs), run_dirs)]
    curves = [[series(records, kind, field, x) for kind, field, _ in PANELS] for _, records in runs]
    moe = [[layer_series(records, field, value, x) for field, _, value in MOE_PANELS] for _, records in runs]
    with_moe = any(layers for run in moe for layers in run)
    longest = max((max(xs) for run in curves for xs, _ in run if xs), default=0.0)
    scale, unit = (1.0, "update steps") if x == "step" else _time_unit(longest)
    fig = new_figure(*size)
    grid = fig.subplots(2, 3 if with_moe else 2, sharex=True)
    axes = list(grid[:, :2].ravel()) + (list(grid[:, 2]) if with_moe else [])  # the four panels, then MoE
    styles = run_styles(len(runs))
    for (label, _), run, (color, line) in zip(runs, curves, styles):
        for ax, (kind, _, _), (xs, ys) in zip(axes, PANELS, run):
            if ys:
                ax.plot([v * scale for v in xs], ys, color=color, linestyle=line, label=label,
                        marker="o" if kind == "valid" else None, markersize=3, linewidth=1.2)
    if with_moe:
        for run, (color, line) in zip(moe, styles):
            for ax, layers in zip(axes[4:], run):
                for xs, ys in layers.values():  # one thin line per MoE layer, in the run's style
                    ax.plot([v * scale for v in xs], ys, color=color, linestyle=line, linewidth=0.8, alpha=0.7)
    titles = [(field, title) for _, field, title in PANELS] + ([(f, t) for f, t, _ in MOE_PANELS] if with_moe else [])
    for ax, (field, title) in zip(axes, titles):
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, f"no {field} in the metrics", transform=ax.transAxes, ha="center", va="center",
                    color="gray")
    axes[3].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    for ax in grid[1]:
        ax.set_xlabel(unit if x == "step" else f"training time ({unit})")
    handles, labels = axes[0].get_legend_handles_labels()
    if not handles:  # no training records at all: take the legend from any panel that has lines
        handles, labels = next((a.get_legend_handles_labels() for a in axes if a.get_legend_handles_labels()[0]),
                               ([], []))
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 4), frameon=False)
    return save_figure(fig, out)
