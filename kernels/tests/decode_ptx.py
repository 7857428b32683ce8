"""Compile the flash-decoding split kernel for an H100 (sm_90) without a GPU and count what its
PTX does: tensor-core MMAs, 16-byte asynchronous copies (pipelined K/V loads).

Run as a script in a process without TRITON_INTERPRET (the interpreter replaces `triton.jit`):
    python kernels/tests/decode_ptx.py DTYPE HEAD_DIM PAGE_TOKENS   -> prints a JSON object
"""

from __future__ import annotations

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget

from nitsum_kernels import decode_attention_triton as dat

POINTERS = ("q", "k_cache", "v_cache", "out", "o_part", "lse_part", "pages", "lens")
TARGET = GPUTarget("cuda", 90, 32)  # H100 / H200
INTS = ("stride_pages", "stride_qt", "stride_qh", "stride_ks", "stride_kh")


def ptx_counts(dtype: str, head_dim: int, page_tokens: int) -> dict[str, int]:
    """{"mma": tensor-core MMA instructions, "cp_async_16": 16-byte async copies} of the split
    kernel as `decode_attention_triton` would launch it (4 query heads per KV head, 5
    splits), and the merge kernel's "merge_stores"."""
    cfg = dat.decode_config(4, head_dim, page_tokens)
    elem = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    sig = {p: ("*fp32" if p in ("o_part", "lse_part") else elem) for p in POINTERS}
    sig |= {"pages": "*i64", "lens": "*i64", "qk_scale": "fp32", "SPLITS": "i32"}
    sig |= {i: "i32" for i in INTS}
    consts = dict(
        q_per_kv=4,
        HEAD_DIM=head_dim,
        PAGE_TOKENS=page_tokens,
        ONE_SPLIT=False,
        BLOCK_R=16,
        BLOCK_N=cfg.block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PAGE_ALIGNED=page_tokens % cfg.block_n == 0,
        DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
        UPCAST=False,
    )
    sig |= {k: "constexpr" for k in consts}
    sig = {name: sig[name] for name in dat._split_kernel.arg_names}  # the kernel's order
    names = list(sig)
    # Pointers and the q/K strides are multiples of 16 elements, as in the engine's tensors.
    aligned = [*POINTERS, "stride_qt", "stride_qh", "stride_ks", "stride_kh"]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = triton.compiler.ASTSource(
        fn=dat._split_kernel,
        signature=sig,
        constexprs=consts,
        attrs=attrs,
    )
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    ptx = triton.compile(src, target=TARGET, options=options).asm["ptx"]
    return {
        "mma": len(re.findall(r"\b(?:wgmma|mma)\.", ptx)),
        "cp_async_16": len(re.findall(r"cp\.async\.\w+\.shared\.global[^;]*, 0x10", ptx)),
        "merge_stores": merge_stores(dtype, head_dim),
    }


def merge_stores(dtype: str, head_dim: int) -> int:
    """Global stores in the PTX of the merge kernel (5 splits): it compiles and writes."""
    consts = dict(HEAD_DIM=head_dim, BLOCK_S=8, BLOCK_D=max(16, head_dim))
    sig = {"o_part": "*fp32", "lse_part": "*fp32", "out": f"*{dtype}"}
    sig |= {"stride_qt": "i32", "stride_qh": "i32", "SPLITS": "i32"}
    sig |= {k: "constexpr" for k in consts}
    src = triton.compiler.ASTSource(fn=dat._merge_kernel, signature=sig, constexprs=consts)
    ptx = triton.compile(src, target=TARGET, options={"num_warps": 4}).asm["ptx"]
    return len(re.findall(r"\bst\.global", ptx))


if __name__ == "__main__":
    dtype, hd, page = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(ptx_counts(dtype, hd, page)))
