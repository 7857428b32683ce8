"""The prefill kernel compiled for NVIDIA GPUs, no GPU needed (Triton's bundled ptxas), with
the block sizes `prefill_blocks` picks: bf16 dots become tensor-core instructions (wgmma on
sm_90, mma.sync on sm_80), K/V loads are pipelined (cp.async), no registers spill and the
shared memory fits. The interpreter the other tests use checks none of this.

Compiling needs Triton out of interpreter mode, which conftest.py switches on for the whole
test process, so the test runs this file as a script in a child process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

POINTERS = ("q", "k_cache", "v_cache", "out", "pages", "row_starts", "q_lens", "ctx_lens")
# Strides a real step passes are multiples of 16 (Triton specializes them so at launch).
ALIGNED = ("stride_qt", "stride_qh", "stride_ks", "stride_kh")


def compile_report(arch: int, dtype: str, head_dim: int, group: int, page: int) -> dict:
    """Compile `_prefill_kernel` for sm_`arch` as `prefill_attention_triton` would launch it
    for a long prompt: instruction counts, registers, spills and shared memory."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nitsum_kernels.prefill_attention_triton import _prefill_kernel, prefill_blocks

    blocks = prefill_blocks(head_dim, group, getattr(torch, dtype), 2048, arch >= 90)
    block_d = max(16, triton.next_power_of_2(head_dim))
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype]
    consts = dict(
        PAGE=page, HEAD_DIM=head_dim, GROUP=group, BLOCK_M=blocks.block_m,
        BLOCK_N=blocks.block_n, BLOCK_D=block_d, BLOCK_C=8, EVEN_D=block_d == head_dim,
        PRECISION="ieee" if dtype == "float32" else "tf32",
    )  # fmt: skip
    names = _prefill_kernel.arg_names
    signature = {}
    for name in names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = "*i64" if name in POINTERS[4:] else f"*{short}"
        else:
            signature[name] = "fp32" if name == "qk_scale" else "i32"
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in POINTERS + ALIGNED}
    kernel = triton.compile(
        ASTSource(_prefill_kernel, signature, consts, attrs),
        target=GPUTarget("cuda", arch, 32),
        options=dict(num_warps=blocks.num_warps, num_stages=blocks.num_stages),
    )
    ptx = kernel.asm["ptx"]
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        dump = subprocess.run(
            [str(bin_dir / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True
        ).stdout
    usage = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", dump)}
    return dict(
        wgmma=ptx.count("wgmma.mma_async"),
        mma_sync=ptx.count("mma.sync"),
        cp_async=ptx.count("cp.async"),
        shared=kernel.metadata.shared,
        **usage,
    )


def _report(arch: int, dtype: str, head_dim: int, group: int, page: int) -> dict:
    """`compile_report` in a child process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)  # kernels/: nitsum_kernels
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    args = [str(a) for a in (arch, dtype, head_dim, group, page)]
    done = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _have_ptxas() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not _have_ptxas(), reason="Triton's NVIDIA backend (ptxas) is not installed")
@pytest.mark.parametrize(
    "arch, dtype, head_dim, group, page, tensor_cores",
    [
        (90, "bfloat16", 128, 4, 16, "wgmma"),  # Llama-3-8B on H100/H200
        (80, "bfloat16", 128, 8, 48, "mma_sync"),  # A100, 8:1 GQA, 48-token pages
        (90, "float32", 128, 4, 16, None),  # ieee dots: FMA, and still no spills
    ],
)
def test_compiles_to_tensor_cores_without_spills(arch, dtype, head_dim, group, page, tensor_cores):
    r = _report(arch, dtype, head_dim, group, page)
    if tensor_cores:
        assert r[tensor_cores] > 0
    else:
        assert r["wgmma"] == r["mma_sync"] == 0
    assert r["cp_async"] > 0  # K/V blocks are prefetched while the previous one computes
    assert r["STACK"] == 0 and r["LOCAL"] == 0, r  # no register spills
    assert r["REG"] <= 255
    assert r["shared"] <= (227 if arch == 90 else 163) * 1024  # the SM's shared memory


if __name__ == "__main__":
    arch, dtype, head_dim, group, page = sys.argv[1:6]
    report = compile_report(int(arch), dtype, int(head_dim), int(group), int(page))
    print(json.dumps(report))
