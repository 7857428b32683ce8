"""Fused elementwise kernels (kernels/fused_ops_triton.py) against their torch references
(kernels/fused_ops.py): on CPU through Triton's interpreter, on CUDA compiled. fp32 within
1e-5, bf16 within 2e-2 (two bf16 ulps: the kernels keep fp32 where the torch code rounds)."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

from nitsum_kernels import fused_ops as ref  # noqa: E402
from nitsum_kernels import fused_ops_triton as tri  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, cols, with_x", [(5, 64, True), (3, 96, True), (4, 80, False)])
def test_add_rms_norm(dtype, rows, cols, with_x):
    """Both outputs: the new residual (written in place) and the normed rows; a width that is
    not a power of two; strided rows (a view into a wider buffer)."""
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(rows, cols, generator=g).to(DEV, dtype) if with_x else None
    wide = torch.randn(rows, cols + 7, generator=g).to(DEV, dtype)
    w = (1 + 0.1 * torch.randn(cols, generator=g)).to(DEV, dtype)
    res_ref, res_tri = wide[:, :cols].clone(), wide[:, :cols]
    out_ref = ref.add_rms_norm(x, res_ref, w, 1e-6)
    out_tri = tri.add_rms_norm_triton(x, res_tri, w, 1e-6)
    close(res_tri, res_ref, dtype)
    close(out_tri, out_ref, dtype)
    if with_x:
        assert not torch.equal(res_tri, out_tri)  # the residual really was added to
    # float64 by hand: the reference itself is RMSNorm.
    h = res_ref.double()
    exact = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    close(out_tri, exact, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups, q_per_group, hd", [(2, 2, 16), (3, 3, 24), (1, 8, 8)])
def test_rotary_kv(dtype, groups, q_per_group, hd):
    """q and k rotated at each token's position; k and v land in the cache at the token's
    slot (strided views of one fused qkv row, as the model passes them); other slots
    untouched."""
    g = torch.Generator().manual_seed(hd + groups)
    tokens, slots_n, max_pos = 7, 40, 64
    qkv = torch.randn(tokens, groups, q_per_group + 2, hd, generator=g).to(DEV, dtype)
    q, k, v = qkv[:, :, :q_per_group], qkv[:, :, q_per_group], qkv[:, :, q_per_group + 1]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    cos_t, sin_t = (t.to(DEV) for t in ref.rotary_table(inv_freq, max_pos))
    positions = torch.randint(0, max_pos, (tokens,), generator=g).to(DEV)
    slots = torch.randperm(slots_n, generator=g)[:tokens].to(DEV)
    caches = torch.randn(2, slots_n, groups, hd, generator=g).to(DEV, dtype)
    kc_ref, vc_ref = caches.clone().unbind(0)
    kc_tri, vc_tri = caches.clone().unbind(0)
    shape = (tokens, groups * q_per_group, hd)
    q_ref = ref.rotary_kv(
        q,
        k,
        v,
        positions,
        cos_t,
        sin_t,
        kc_ref,
        vc_ref,
        slots,
        torch.empty(shape, dtype=dtype, device=DEV),
    )
    q_tri = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    tri.rotary_kv_triton(q, k, v, positions, cos_t, sin_t, kc_tri, vc_tri, slots, q_tri)
    close(q_tri, q_ref, dtype)
    close(kc_tri, kc_ref, dtype)
    assert torch.equal(vc_tri, vc_ref)
    untouched = torch.ones(slots_n, dtype=torch.bool)
    untouched[slots.cpu()] = False
    assert torch.equal(kc_tri[untouched.to(DEV)], caches[0][untouched.to(DEV)])
    # The rotation itself, by hand in float64 at one token: angle pos · inv_freq per pair.
    t = 3
    ang = positions[t].item() * inv_freq.double()
    x = q[t, 0, 0].double().cpu()
    a, b = x[: hd // 2], x[hd // 2 :]
    exact = torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()])
    close(q_tri[t, 0].cpu(), exact, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("blocks, block", [(1, 48), (4, 12), (2, 1100)])
def test_silu_mul(dtype, blocks, block):
    """SiLU(gate)·up over the interleaved [gate_b, up_b] layout, as a TP shard sees it (a
    view of some blocks of the full rows); widths past one tile."""
    g = torch.Generator().manual_seed(blocks * block)
    full = torch.randn(5, (blocks + 1) * 2 * block, generator=g).to(DEV, dtype)
    shard = full[:, 2 * block :]  # a rank's blocks: a strided view
    out_ref = ref.silu_mul(shard, block)
    out_tri = tri.silu_mul_triton(shard, block)
    close(out_tri, out_ref, dtype)
    gu = shard.double().view(5, blocks, 2, block)
    exact = (torch.nn.functional.silu(gu[:, :, 0]) * gu[:, :, 1]).reshape(5, -1)
    close(out_tri, exact, dtype)


def compiled(kernel) -> int:
    """Compiled variants of a jitted kernel (CUDA: Triton's per-device kernel caches)."""
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


@pytest.mark.skipif(
    DEV != "cuda", reason="compilation is a GPU matter (the interpreter compiles nothing)"
)
def test_tp_shapes_and_token_counts_reuse_the_compiled_kernels():
    """The shard shapes of TP 1, 2 and 4 (8 query / 4 KV heads; MLP 4·1024 wide) and any
    token count run on the kernels compiled for the first: no compile on a TP switch."""
    hd, dtype = 16, torch.bfloat16
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    cos_t, sin_t = (t.to(DEV) for t in ref.rotary_table(inv_freq, 64))
    counts = []
    for tp in (1, 2, 4, 2, 1):
        groups, hidden = 4 // tp, 64
        for tokens in (1, 5, 33):
            qkv = torch.randn(tokens, groups, 4, hd, device=DEV, dtype=dtype)
            kc = torch.zeros(64, groups, hd, device=DEV, dtype=dtype)
            slots = torch.arange(tokens, device=DEV)
            pos = torch.arange(tokens, device=DEV)
            q_out = torch.empty(tokens, groups * 2, hd, device=DEV, dtype=dtype)
            tri.rotary_kv_triton(
                qkv[:, :, :2], qkv[:, :, 2], qkv[:, :, 3], pos, cos_t, sin_t, kc, kc.clone(),
                slots, q_out,
            )  # fmt: skip
            x = torch.randn(tokens, hidden, device=DEV, dtype=dtype)
            w = torch.ones(hidden, device=DEV, dtype=dtype)
            tri.add_rms_norm_triton(x, x.clone(), w, 1e-6)
            tri.silu_mul_triton(torch.randn(tokens, 2 * 4096 // tp, device=DEV, dtype=dtype), 1024)
        counts.append(
            [
                compiled(k)
                for k in (tri._rotary_kv_kernel, tri._add_rms_norm_kernel, tri._silu_mul_kernel)
            ]
        )
    assert counts == [counts[0]] * len(counts), counts
