"""The kernels' tests: Triton's interpreter without a GPU, helpers importable by name."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

# NOTE: Triton reads TRITON_INTERPRET when it is first imported (its language functions are
# made then), so without a GPU the interpreter is switched on here, before any test or the
# kernels import triton; on a GPU the kernels compile for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Test helpers (triton_interpret.py, decode_ptx.py, slots.py) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))
