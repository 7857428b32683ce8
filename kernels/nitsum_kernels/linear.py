"""Dense layers on the fastest GEMM torch ships for the tensor's device and dtype.

On CPU in fp32, `F.linear` goes to MKL, which on this project's AMD EPYC test machine runs
at about half the speed of oneDNN on the same weights (measured with this model's shapes:
batch 1, 18 vs 32 ms for all of SmolLM2's linears; batch 16, 27 vs 55 ms; prefill chunks of
512, 347 vs 738 ms). So fp32 on CPU calls oneDNN's linear (the op Inductor's CPU backend
uses), on the plain weights: no prepacked copy, any strides (TP shards are views, and
row-parallel weights are stored (in, out) and passed transposed). bf16 and CUDA already take
their best path through `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _onednn_linear_works() -> bool:
    """Whether oneDNN's linear exists in this torch build and agrees with F.linear."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        x, w = torch.randn(3, 8), torch.randn(5, 8)
        return bool(torch.allclose(op(x, w, None, "none", [], ""), F.linear(x, w), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = torch.backends.mkldnn.is_available() and _onednn_linear_works()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), like `F.linear`; weight (out, in), any strides."""
    if _ONEDNN and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0]:
        # NOTE: oneDNN reads the bias as contiguous (a strided one gives wrong sums).
        b = bias.contiguous() if bias is not None else None
        return torch.ops.mkldnn._linear_pointwise(x, weight, b, "none", [], "")
    return F.linear(x, weight, bias)
