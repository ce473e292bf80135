"""A matplotlib figure of an exact pixel size on the Agg canvas, and saving it atomically.

No pyplot: figures are plain ``Figure`` objects, so nothing global is touched and no
display is ever needed.
"""
from __future__ import annotations

from pathlib import Path

from nmtkit.errors import ConfigError, NmtkitError

DPI = 100


def parse_size(text: str) -> tuple[int, int]:
    """'1200x800' -> (1200, 800) pixels."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--size {text!r}: expected WIDTHxHEIGHT in pixels, e.g. 1200x800") from None
    if not (50 <= width <= 20000 and 50 <= height <= 20000):
        raise ConfigError(f"--size {text!r}: each side must be between 50 and 20000 pixels")
    return width, height


def new_figure(width: int, height: int):
    """An empty Figure of ``width`` x ``height`` pixels with constrained layout."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise NmtkitError("plotting needs matplotlib: pip install 'nmtkit[plot]'") from None
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` in the format its suffix names (png, pdf, svg, ...), atomically."""
    from nmtkit.files import atomic_open

    path = Path(path)
    kind = path.suffix.lstrip(".").lower()
    supported = fig.canvas.get_supported_filetypes()
    if kind not in supported:
        raise ConfigError(f"{path}: unknown image format {kind!r}; use one of {', '.join(sorted(supported))}")
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format=kind, dpi=DPI)
    return path
