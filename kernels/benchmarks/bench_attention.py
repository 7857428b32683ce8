"""Decode attention against the memory-bandwidth floor (for a session lent a GPU).

At batch 16, 32 query / 8 KV heads, head dim 128, bf16, 16-token pages scattered over the
pool, for each context: the flash-decoding Triton kernel
(nitsum_kernels/decode_attention_triton.py), the torch reference's decode path (page gather
+ SDPA, default backend, the mask made once as a step does for all layers), and a
device-to-device copy of the same K/V bytes. Prints µs, the bandwidth each achieves (the
kernel: K+V bytes read / time; the copy: bytes read + written / time), the kernel's share of
the copy's bandwidth, the floor (K+V bytes at the copy's bandwidth), the speed-up over
gather+SDPA, and the largest difference between the two outputs (a wrong kernel must not
look fast). Times are medians of triton.testing.do_bench, which flushes L2 between runs.

    python kernels/benchmarks/bench_attention.py [--contexts 1024 4096 16384] [--json PATH]
    python kernels/benchmarks/bench_attention.py --device cpu   # tiny shapes, Triton
                                # interpreter: checks the script only; timings meaningless
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

# Kernel vs gather+SDPA, both bf16 outputs of values below ~4 in magnitude: a few bf16 ulps.
MAX_DIFF = 5e-2


@dataclass
class Row:
    """One context's measurements."""

    context: int
    splits: int
    kv_bytes: int  # K+V of the whole batch's contexts
    kernel_us: float
    sdpa_us: float
    copy_us: float
    kernel_gbps: float  # kv_bytes / kernel time
    copy_gbps: float  # 2 · kv_bytes (read + write) / copy time
    pct_of_copy: float
    floor_us: float  # kv_bytes at the copy's bandwidth
    speedup_vs_sdpa: float
    max_abs_diff: float  # kernel vs gather+SDPA output


def time_us(fn: Callable[[], object], device: str) -> float:
    """Median µs of `fn`: CUDA events with L2 flushed (do_bench); wall clock on CPU."""
    if device.startswith("cuda"):
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    fn()
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return sorted(runs)[1] * 1e6


def bench_context(args: argparse.Namespace, ctx: int, g: torch.Generator) -> Row:
    from nitsum_kernels.decode_attention_triton import decode_attention_triton, decode_splits
    from nitsum_kernels.paged_attention import attend, gather_pages

    dev, dtype, page = args.device, getattr(torch, args.dtype), args.page
    b, hq, hkv, hd = args.batch, args.q_heads, args.kv_heads, args.head_dim
    per_seq = -(-ctx // page)
    num_pages = b * per_seq + 1
    # NOTE: drawn on the device (a GiB of K/V at 16k would take seconds of CPU per context).
    kc = torch.randn(num_pages * page, hkv, hd, generator=g, device=dev, dtype=dtype)
    vc = torch.randn(num_pages * page, hkv, hd, generator=g, device=dev, dtype=dtype)
    table = torch.randperm(num_pages, generator=g, device=dev)[: b * per_seq].view(b, per_seq)
    lens = torch.full((b,), ctx, dtype=torch.long, device=dev)
    q = torch.randn(b, hq, hd, generator=g, device=dev, dtype=dtype)
    scale = hd**-0.5
    splits = args.splits or decode_splits(b, hkv, ctx, q.device)
    out = torch.empty_like(q)

    def kernel() -> None:
        decode_attention_triton(q, kc, vc, table, lens, page, scale, out, ctx, splits)

    def sdpa() -> torch.Tensor:
        kd = gather_pages(kc, table, page)[:, :ctx].transpose(1, 2)
        vd = gather_pages(vc, table, page)[:, :ctx].transpose(1, 2)
        # NOTE: every context is `ctx` long, so no mask: SDPA takes its fastest backend (a
        # masked call would go to the math backend, a weaker baseline).
        return attend(q.unsqueeze(2), kd, vd, scale).squeeze(2)

    # The bytes the kernel must read: each sequence's K and V, as one contiguous block.
    kv_bytes = 2 * b * ctx * hkv * hd * kc.element_size()
    src = torch.empty(kv_bytes // kc.element_size(), dtype=dtype, device=dev)
    dst = torch.empty_like(src)
    kernel()
    diff = float((out.float() - sdpa().float()).abs().max())
    t_kernel = time_us(kernel, dev)
    t_sdpa = time_us(sdpa, dev)
    t_copy = time_us(lambda: dst.copy_(src), dev)
    kernel_gbps = kv_bytes / t_kernel / 1e3
    copy_gbps = 2 * kv_bytes / t_copy / 1e3
    return Row(
        context=ctx,
        splits=splits,
        kv_bytes=kv_bytes,
        kernel_us=t_kernel,
        sdpa_us=t_sdpa,
        copy_us=t_copy,
        kernel_gbps=kernel_gbps,
        copy_gbps=copy_gbps,
        pct_of_copy=100 * kernel_gbps / copy_gbps,
        floor_us=kv_bytes / copy_gbps / 1e3,
        speedup_vs_sdpa=t_sdpa / t_kernel,
        max_abs_diff=diff,
    )


def print_table(rows: list[Row], title: str) -> None:
    print(title)
    head = (
        f"{'context':>8} {'splits':>6} {'KV MB':>8} {'kernel us':>10} {'GB/s':>7} "
        f"{'% copy':>7} {'floor us':>9} {'SDPA us':>9} {'vs SDPA':>8} {'copy us':>9} "
        f"{'copy GB/s':>10} {'max|diff|':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.context:>8} {r.splits:>6} {r.kv_bytes / 1e6:>8.1f} {r.kernel_us:>10.1f} "
            f"{r.kernel_gbps:>7.0f} {r.pct_of_copy:>6.1f}% {r.floor_us:>9.1f} {r.sdpa_us:>9.1f} "
            f"{r.speedup_vs_sdpa:>7.2f}x {r.copy_us:>9.1f} {r.copy_gbps:>10.0f} "
            f"{r.max_abs_diff:>10.2e}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (interpreter)")
    ap.add_argument("--contexts", type=int, nargs="+", default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--splits", type=int, default=None, help="pin the split count (tuning)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args()
    cpu = args.device == "cpu"
    if cpu:
        # NOTE: before anything imports triton (it reads the switch at import).
        os.environ["TRITON_INTERPRET"] = "1"
        args.batch = args.batch or 2
        args.contexts = args.contexts or [64, 600]  # 600: several splits
        args.q_heads, args.kv_heads, args.head_dim = 8, 2, 32
    elif not torch.cuda.is_available():
        print(
            "bench_attention: no CUDA device; this benchmark needs a GPU "
            "(--device cpu runs tiny shapes under the Triton interpreter to check the script).",
            file=sys.stderr,
        )
        return 2
    args.batch = args.batch or 16
    args.contexts = args.contexts or [1024, 2048, 4096, 8192, 16384]
    g = torch.Generator(device=args.device).manual_seed(0)
    rows = [bench_context(args, ctx, g) for ctx in args.contexts]
    where = "CPU, Triton interpreter: TIMINGS MEANINGLESS" if cpu else torch.cuda.get_device_name()
    print_table(
        rows,
        f"decode attention, batch {args.batch}, {args.q_heads} q / {args.kv_heads} kv heads, "
        f"head dim {args.head_dim}, {args.dtype}, page {args.page} ({where})",
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "rows": [asdict(r) for r in rows]}, f, indent=2)
    wrong = [r.context for r in rows if not r.max_abs_diff <= MAX_DIFF]
    if wrong:
        msg = f"bench_attention: kernel and gather+SDPA disagree at contexts {wrong}"
        print(msg, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
