"""``nmtkit serve``: translations over HTTP.

    requests.py   what a request may hold, and its limits (no torch, no HTTP library)
    batcher.py    the one thread that owns the model; requests arriving together share its calls
    app.py        the Starlette app (routes, 4xx JSON errors) and ``serve`` under uvicorn
"""
from __future__ import annotations


def require_http_stack() -> None:
    """Fail in one line when the optional HTTP libraries are missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        from nmtkit.errors import NmtkitError

        raise NmtkitError("nmtkit serve needs Starlette and uvicorn: pip install 'nmtkit[serve]'") from None
