"""Triton kernels of the fused elementwise ops; same contracts as `fused_ops.py` (their torch
references, tested against under `TRITON_INTERPRET=1` on CPU).

One launch each where the unfused torch code launches 4-12 kernels:
- `add_rms_norm_triton`: one program per token row; the add and the reduction in fp32.
- `rotary_kv_triton`: one program per (token, KV group): the group's query heads and its
  k head rotated, k and v stored into the cache slot of the token.
- `silu_mul_triton`: programs over (token, block of output columns).

NOTE: TP-agnostic by construction: head counts, widths and strides are runtime ints (head
counts also `do_not_specialize`, so a TP switch that changes them reuses the compiled
kernel); only head_dim and power-of-two block sizes are constexpr. The grid carries the
token count, so a new batch size never compiles anything.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    x,  # (rows, cols) added into `residual` when HAS_X
    residual,  # (rows, cols), updated in place when HAS_X
    weight,  # (cols,)
    out,  # (rows, cols)
    cols,
    eps,
    stride_x,
    stride_r,
    stride_o,
    HAS_X: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < cols
    h = tl.load(residual + row * stride_r + c, mask=ok, other=0.0)
    if HAS_X:
        xv = tl.load(x + row * stride_x + c, mask=ok, other=0.0)
        # NOTE: the new residual is rounded to the model's dtype before the norm reads it,
        # as the unfused `h += x; rms_norm(h)` does.
        h = (h.to(tl.float32) + xv.to(tl.float32)).to(residual.dtype.element_ty)
        tl.store(residual + row * stride_r + c, h, mask=ok)
    hf = h.to(tl.float32)
    var = tl.sum(hf * hf, axis=0) / cols
    y = (hf * tl.rsqrt(var + eps)).to(out.dtype.element_ty).to(tl.float32)
    w = tl.load(weight + c, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + row * stride_o + c, (w * y).to(out.dtype.element_ty), mask=ok)


def add_rms_norm_triton(
    x: torch.Tensor | None,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fused_ops.add_rms_norm` in one launch: residual += x (in place; none when x is None),
    returns RMSNorm(residual) (into `out` when given). Rows of unit column stride."""
    rows, cols = residual.shape
    out = torch.empty_like(residual) if out is None else out
    if rows == 0:
        return out
    src = residual if x is None else x
    assert residual.stride(1) == 1 and src.stride(1) == 1 and out.stride(1) == 1
    block = triton.next_power_of_2(cols)
    _add_rms_norm_kernel[(rows,)](
        src, residual, weight, out, cols, eps, src.stride(0), residual.stride(0), out.stride(0),
        HAS_X=x is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["q_per_group"])
def _rotary_kv_kernel(
    q,  # (tokens, groups, q_per_group, hd), any strides but the last
    k,  # (tokens, groups, hd)
    v,
    positions,  # (tokens,)
    cos_t,  # (positions, HALF) fp32
    sin_t,
    q_out,  # (tokens, groups · q_per_group, hd)
    k_cache,  # (slots, groups, hd)
    v_cache,
    slots,  # (tokens,)
    q_per_group,
    stride_qt,
    stride_qg,
    stride_qh,
    stride_kt,
    stride_kg,
    stride_vt,
    stride_vg,
    stride_ot,
    stride_oh,
    stride_cs,
    stride_ch,
    HALF: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HALF
    pos = tl.load(positions + t)
    c = tl.load(cos_t + pos * HALF + d, mask=d_ok, other=0.0)
    s = tl.load(sin_t + pos * HALF + d, mask=d_ok, other=0.0)
    # The group's query heads: rows r of a (BLOCK_R, BLOCK_D) tile per half.
    r = tl.arange(0, BLOCK_R)
    m = (r < q_per_group)[:, None] & d_ok[None, :]
    qp = q + t * stride_qt + g * stride_qg + r[:, None] * stride_qh + d[None, :]
    q1 = tl.load(qp, mask=m, other=0.0).to(tl.float32)
    q2 = tl.load(qp + HALF, mask=m, other=0.0).to(tl.float32)
    op = q_out + t * stride_ot + (g * q_per_group + r)[:, None] * stride_oh + d[None, :]
    tl.store(op, (q1 * c[None, :] - q2 * s[None, :]).to(q_out.dtype.element_ty), mask=m)
    tl.store(op + HALF, (q2 * c[None, :] + q1 * s[None, :]).to(q_out.dtype.element_ty), mask=m)
    # The group's k head, rotated, and its v head go to the token's cache slot.
    slot = tl.load(slots + t)
    kp = k + t * stride_kt + g * stride_kg + d
    k1 = tl.load(kp, mask=d_ok, other=0.0).to(tl.float32)
    k2 = tl.load(kp + HALF, mask=d_ok, other=0.0).to(tl.float32)
    cp = slot * stride_cs + g * stride_ch + d
    tl.store(k_cache + cp, (k1 * c - k2 * s).to(k_cache.dtype.element_ty), mask=d_ok)
    tl.store(k_cache + cp + HALF, (k2 * c + k1 * s).to(k_cache.dtype.element_ty), mask=d_ok)
    vp = v + t * stride_vt + g * stride_vg + d
    tl.store(v_cache + cp, tl.load(vp, mask=d_ok, other=0.0), mask=d_ok)
    tl.store(v_cache + cp + HALF, tl.load(vp + HALF, mask=d_ok, other=0.0), mask=d_ok)


def rotary_kv_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    q_out: torch.Tensor,
) -> torch.Tensor:
    """`fused_ops.rotary_kv` in one launch (same shapes; every last dim of unit stride)."""
    tokens, groups, r, hd = q.shape
    if tokens == 0:
        return q_out
    assert hd % 2 == 0 and cos_table.shape[1] * 2 == hd and cos_table.is_contiguous()
    assert all(t.stride(-1) == 1 for t in (q, k, v, q_out, k_cache, v_cache))
    assert v_cache.stride() == k_cache.stride()
    half = hd // 2
    _rotary_kv_kernel[(tokens, groups)](
        q, k, v, positions, cos_table, sin_table, q_out, k_cache, v_cache, slots, r,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1),
        HALF=half, BLOCK_R=triton.next_power_of_2(r), BLOCK_D=triton.next_power_of_2(half),
    )  # fmt: skip
    return q_out


@triton.jit(do_not_specialize=["width", "block"])
def _silu_mul_kernel(gate_up, out, width, block, stride_g, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # output column
    ok = j < width
    b = j // block
    src = gate_up + t * stride_g + b * block + j  # gate column: b · 2 · block + (j - b · block)
    g = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(src + block, mask=ok, other=0.0).to(tl.float32)
    # NOTE: SiLU rounded to the model's dtype before the product, as `F.silu(g) * u` does.
    a = (g * tl.sigmoid(g)).to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + t * stride_o + j, (a * u).to(out.dtype.element_ty), mask=ok)


def silu_mul_triton(gate_up: torch.Tensor, block: int) -> torch.Tensor:
    """`fused_ops.silu_mul` in one launch."""
    tokens, cols = gate_up.shape
    width = cols // 2
    out = torch.empty(tokens, width, dtype=gate_up.dtype, device=gate_up.device)
    if tokens == 0:
        return out
    assert gate_up.stride(1) == 1 and width % block == 0
    tile = min(1024, triton.next_power_of_2(width))
    _silu_mul_kernel[(tokens, triton.cdiv(width, tile))](
        gate_up, out, width, block, gate_up.stride(0), out.stride(0), BLOCK=tile
    )
    return out
