"""Who may use the server: an optional API key, and a warning when it listens beyond this
machine without one.

With a key (``--api-key`` or the NMTKIT_API_KEY environment variable) every route answers
401 unless the request carries it, as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``.
The comparison takes the same time wherever the given key first differs
(``hmac.compare_digest``), so timing does not reveal the key a character at a time.
"""
from __future__ import annotations

import hmac
import ipaddress
from typing import Optional

from nmtkit.errors import ConfigError
from nmtkit.serving.requests import RequestError

KEY_HEADER = "x-api-key"
KEY_CHARS = frozenset(chr(code) for code in range(0x21, 0x7f))  # what an HTTP header carries unchanged


def check_key(key: Optional[str]) -> Optional[str]:
    """The key, or a ConfigError when no client could send it (empty, spaces, non-ASCII)."""
    if key is None:
        return None
    if not key or not set(key) <= KEY_CHARS:
        raise ConfigError("--api-key (or NMTKIT_API_KEY) must be printable ASCII without spaces, and not empty")
    return key


def presented_key(headers) -> str:
    """The key a request carries (``Authorization: Bearer``, else ``X-API-Key``), "" for none."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get(KEY_HEADER, "")


def authorize(headers, key: Optional[str]) -> None:
    """Nothing when the server has no key or ``headers`` carry it; else a 401 RequestError."""
    if key is None:
        return
    given = presented_key(headers)
    # as bytes (Starlette decodes headers as latin-1): compare_digest refuses non-ASCII str
    if not given or not hmac.compare_digest(given.encode("latin-1"), key.encode()):
        raise RequestError(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
                           "unauthorized", {"www-authenticate": "Bearer"})


def exposure_warning(address: str, key: Optional[str]) -> str:
    """A warning when the server listens on ``address`` (the bound socket's) beyond loopback
    without a key: anyone who can reach the port can make it translate. "" otherwise."""
    if key is not None:
        return ""
    try:
        loopback = ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return ""
    return (f"listening on {address}, beyond this machine, without an API key: anyone who reaches the port can "
            "use the server; give --api-key (or NMTKIT_API_KEY), or bind 127.0.0.1")
