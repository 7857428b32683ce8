"""HF repo ids (`org/name`) resolved from the local Hugging Face cache; nothing is downloaded.

The cache layout (huggingface_hub): `HUB/models--org--name/refs/main` names a commit whose
files are in `HUB/models--org--name/snapshots/<commit>/`. HUB is `$HF_HUB_CACHE`, else
`$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# NOTE: huggingface_hub's repo id rule, one namespace: letters, digits, `-_.`, no `--`/`..`.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_repo_id(model: str) -> bool:
    """Whether `model` reads as an HF repo id rather than a path (`org/name`, no such path)."""
    return bool(_REPO_ID.match(model)) and ".." not in model and not Path(model).exists()


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps its model snapshots."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def cached_snapshot(repo_id: str, hub: Path | None = None) -> Path:
    """The snapshot directory of `repo_id` (the `main` ref's, else the newest with a
    config.json); FileNotFoundError saying how to fetch it when it is not cached."""
    hub = hub_cache_dir() if hub is None else hub
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip()
        if (pinned / "config.json").is_file():
            return pinned
    found = sorted(
        (d for d in snapshots.glob("*") if (d / "config.json").is_file()),
        key=lambda d: d.stat().st_mtime,
    )
    if found:
        return found[-1]
    raise FileNotFoundError(
        f"model {repo_id!r} is not in the local Hugging Face cache ({hub}); Nitsum fetches "
        f"nothing: download it first (`huggingface-cli download {repo_id}`) or pass a "
        "model directory"
    )
