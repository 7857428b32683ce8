"""kernels/linear.py agrees with F.linear on every weight and bias layout the model passes."""

import torch
import torch.nn.functional as F

from nitsum_kernels.linear import linear


def test_linear_matches_f_linear_on_views_and_strided_bias():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g)
    stored_t = torch.randn(32, 48, generator=g)  # row-parallel weights are stored (in, out)
    big_bias = torch.randn(3 * 48, generator=g)
    x = torch.randn(5, 32, generator=g)
    cases = [
        (x, w, None),
        (x, w[8:24], None),  # a column-parallel TP shard: a row slice
        (x[:, 16:], w[:, 16:], None),  # a column slice (strided rows)
        (x, stored_t.t(), None),  # (in, out) storage passed transposed
        (x, w, big_bias[:48]),
        (x, w, big_bias[::3]),  # strided bias
        (x[:0], w, None),  # no rows
    ]
    for xs, ws, b in cases:
        torch.testing.assert_close(linear(xs, ws, b), F.linear(xs, ws, b), atol=1e-5, rtol=1e-5)
