"""Shared fixtures. The embedded SmolLM2 is prepared (GGUF -> HF dir) once per test run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# NOTE: Triton reads TRITON_INTERPRET when it is first imported (its language functions are
# made then), so without a GPU the interpreter is switched on here, before any test or
# library imports triton; on a GPU the kernels compile for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Test helpers (tiny.py) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def nitsum_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``NITSUM_CACHE`` for the whole run: the caller's if set (CI may keep it), else a tmp dir,
    so tests never touch ~/.cache."""
    existing = os.environ.get("NITSUM_CACHE")
    if existing:
        yield Path(existing)
        return
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("nitsum-cache")
    mp.setenv("NITSUM_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def smollm2_dir(nitsum_cache: Path) -> Path:
    """The embedded SmolLM2-135M-Instruct as a prepared HF directory."""
    from nitsum.weights.prepare import resolve_model

    return resolve_model(None)
