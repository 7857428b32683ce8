"""The tensors of one step that cross an attention call.

The model's forward is cut at each layer's attention (`LlamaModel.begin/between/end`): the
pieces between two attention calls read and write only these. Eagerly they are the step's
own tensors; for recorded pieces (engine/piecewise.py) they are static buffers of a token
bucket, which a piece must write in place (a CUDA graph replays fixed addresses).
"""

from __future__ import annotations

import torch


class Activations:
    """Per-token tensors handed between the pieces of a forward and its attention calls."""

    def __init__(self, h: torch.Tensor, static: bool = False) -> None:
        self.h = h  # (tokens, hidden) the residual stream, updated in place
        self.static = static
        self.q: torch.Tensor | None = None  # (tokens, q_heads, hd), rotated
        # The unfused path's rotated k and v (tokens, kv_heads, hd), not yet in the cache;
        # the fused path writes them in the rotary kernel and leaves these None.
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.o: torch.Tensor | None = None  # (tokens, q_heads · hd) attention output
        # The unfused path's rotary cos/sin of the step's positions ((tokens, 1, hd) each).
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None

    def put(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """Hand `value` on as `name`: rebinding eagerly; static, copied into the first rows
        of the buffer (NOTE: a static buffer must exist already, at the bucket's size)."""
        if not self.static:
            setattr(self, name, value)
            return value
        buf = getattr(self, name)
        assert buf is not None, f"no static buffer {name!r}"
        buf[: value.shape[0]].copy_(value)
        return buf

    def out(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """Where a kernel writes `name`: the static buffer, or a new tensor (eagerly)."""
        buf = getattr(self, name)
        if self.static:
            assert buf is not None and buf.shape == shape, f"static {name!r} is not {shape}"
            return buf
        buf = torch.empty(shape, dtype=like.dtype, device=like.device)
        setattr(self, name, buf)
        return buf
