"""Reading a server's raw answer off a socket, for the tests that speak HTTP by hand."""
from __future__ import annotations

import socket


def answer_of(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends on ``sock`` until it closes it, or ``timeout`` passes, or it resets."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return data
