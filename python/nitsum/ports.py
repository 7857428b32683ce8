"""Loopback TCP ports for local servers and rendezvous (router, workers, KV transport)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now.

    NOTE: free when asked, not reserved: another process may take it before the caller binds,
    so callers bind soon after and treat a failed bind as an ordinary startup error.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
