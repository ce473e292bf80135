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


def check_image_path(path: str | Path) -> tuple[Path, str]:
    """The image file ``-o`` names (see nmtkit.storage.outputs) and its format, the suffix of ``path``."""
    from nmtkit.storage.outputs import check_output_file

    target = check_output_file(path)
    kind = Path(path).suffix.lstrip(".").lower()
    supported = _canvas().get_supported_filetypes()
    if kind not in supported:
        raise ConfigError(f"{path}: unknown image format {kind!r}; use one of {', '.join(sorted(supported))}")
    return target, kind


def _canvas():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise NmtkitError("plotting needs matplotlib: pip install 'nmtkit[plot]'") from None
    return FigureCanvasAgg


def new_figure(width: int, height: int):
    """An empty Figure of ``width`` x ``height`` pixels with constrained layout."""
    canvas = _canvas()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    canvas(fig)
    return fig


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` in the format its suffix names (png, pdf, svg, ...), atomically (a device
    or named pipe directly)."""
    from nmtkit.storage.outputs import open_output

    target, kind = check_image_path(path)
    with open_output(target, "wb") as handle:
        fig.savefig(handle, format=kind, dpi=DPI)
    return Path(path)
