"""Where Nitsum keeps files it derives on the user's machine (prepared models, ...)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The Nitsum cache root: ``$NITSUM_CACHE`` if set, else ``~/.cache/nitsum``.

    The directory is created on demand, so callers can write into it directly.
    """
    env = os.environ.get("NITSUM_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "nitsum"
    root.mkdir(parents=True, exist_ok=True)
    return root
