"""Flash-decoding kernel (kernels/decode_attention_triton.py) against float64 attention over each
sequence's gathered pages: on CPU through Triton's interpreter (conftest.py switches it on),
on CUDA compiled."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

from nitsum_kernels.decode_attention_triton import (  # noqa: E402
    MAX_SPLITS,
    MIN_SPLIT_TOKENS,
    DecodeConfig,
    decode_attention_triton,
    decode_splits,
)


def _decode_case(lens, page_tokens, kv_heads, q_per_kv, hd, dtype, width=None, seed=0):
    """Decode queries over contexts of `lens` in scattered pages (table `width` pages wide,
    padded with page 0): (q, k_cache, v_cache, pages, lens) on DEV."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_tokens) for n in lens]
    width = width or max(need)
    num_pages = sum(need) + 3
    order = torch.randperm(num_pages, generator=g).tolist()
    table = torch.zeros(len(lens), width, dtype=torch.long)
    for i, n in enumerate(need):
        table[i, :n] = torch.tensor([order.pop() for _ in range(n)])
    shape = (num_pages * page_tokens, kv_heads, hd)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(len(lens), kv_heads * q_per_kv, hd, generator=g).to(dtype)
    tensors = (q, k_cache, v_cache, table, torch.tensor(lens))
    return tuple(t.to(DEV) for t in tensors)


def _attention_f64(q, k_cache, v_cache, pages, lens, page_tokens, scale):
    """Float64 softmax attention of each query row over its sequence's positions 0..len-1,
    gathered slot by slot from its pages; GQA by repeating KV heads."""
    out = torch.empty(q.shape, dtype=torch.float64)
    r = q.shape[1] // k_cache.shape[1]
    for i, n in enumerate(lens.tolist()):
        pos = torch.arange(n, device=pages.device)
        slots = pages[i, pos // page_tokens] * page_tokens + pos % page_tokens
        k = k_cache[slots].double().cpu().repeat_interleave(r, dim=1)  # (n, Hq, hd)
        v = v_cache[slots].double().cpu().repeat_interleave(r, dim=1)
        w = torch.softmax(torch.einsum("hd,nhd->hn", q[i].double().cpu(), k) * scale, -1)
        out[i] = torch.einsum("hn,nhd->hd", w, v)
    return out


def _run(q, k_cache, v_cache, pages, lens, page_tokens, max_len=None, splits=None, config=None):
    out = torch.full_like(q, float("nan"))
    scale = q.shape[-1] ** -0.5
    max_len = max_len or int(lens.max())
    decode_attention_triton(
        q, k_cache, v_cache, pages, lens, page_tokens, scale, out, max_len, splits, config
    )
    return out


def _assert_matches_f64(out, ref, dtype):
    """fp32 within 1e-4 of float64; bf16/fp16 within 1% (of the output's scale)."""
    tol = 1e-4 if dtype == torch.float32 else 1e-2 * float(ref.abs().max())
    rtol = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "page_tokens, kv_heads, q_per_kv, hd, splits, block_n",
    [
        (16, 2, 4, 128, 1, None),  # GQA 4:1, one split: stage 1 writes the output
        (16, 2, 4, 128, 7, None),  # many splits, some empty for the short rows
        (48, 1, 8, 128, 3, None),  # GQA 8:1, 48-token pages looked up per position
        (48, 2, 8, 128, 4, 16),  # 16 divides 48: one page lookup per block
        (48, 1, 4, 24, 5, 32),  # a head dim that is not a power of two
        (16, 3, 3, 16, 2, 16),  # small head dim, 3 query heads padded to 16 rows
    ],
)
def test_decode_matches_float64(page_tokens, kv_heads, q_per_kv, hd, splits, block_n, dtype):
    """Ragged lengths in one batch (1, one past a page, a page multiple plus a tail, a long
    one), every GQA/page/split shape: the kernel equals float64 attention over the pages."""
    lens = [1, page_tokens + 1, 3 * page_tokens + 5, 9 * page_tokens - 2]
    case = _decode_case(lens, page_tokens, kv_heads, q_per_kv, hd, dtype, seed=hd + page_tokens)
    config = DecodeConfig(block_n, 4, 2) if block_n else None
    out = _run(*case, page_tokens, splits=splits, config=config)
    ref = _attention_f64(*case, page_tokens, hd**-0.5)
    _assert_matches_f64(out, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_8k_context(dtype):
    """One sequence of 8k tokens (one KV head, 4 query heads, head dim 128) under the host's
    own split choice, and unsplit: both equal float64 attention."""
    n = 8192 - 3
    case = _decode_case([n], 16, 1, 4, 128, dtype, seed=8)
    ref = _attention_f64(*case, 16, 128**-0.5)
    started = time.monotonic()
    chosen = decode_splits(1, 1, n, torch.device(DEV))
    assert chosen > 1
    _assert_matches_f64(_run(*case, 16), ref, dtype)
    _assert_matches_f64(_run(*case, 16, splits=1), ref, dtype)
    assert time.monotonic() - started < 120, "too slow for the interpreter budget"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_graph_width(dtype):
    """As a CUDA graph records it: a page table far wider than the contexts, the host max
    length of the whole table and so more splits than the lengths need. The result is that
    of an eager launch sized to the real lengths (most of the graph's splits are empty)."""
    page_tokens, lens = 16, [1, 37, 200, 2 * 16]
    case = _decode_case(lens, page_tokens, 2, 4, 64, dtype, width=256, seed=3)
    q, kc, vc, pages, lens_t = case
    eager_pages = pages[:, : -(-max(lens) // page_tokens)]
    eager = _run(q, kc, vc, eager_pages, lens_t, page_tokens)
    window = pages.shape[1] * page_tokens
    graph_splits = decode_splits(len(lens), 2, window, torch.device(DEV))
    assert graph_splits > decode_splits(len(lens), 2, max(lens), torch.device(DEV))
    graph = _run(*case, page_tokens, max_len=window)
    pinned = _run(*case, page_tokens, max_len=window, splits=MAX_SPLITS)
    ref = _attention_f64(*case, page_tokens, 64**-0.5)
    for out in (eager, graph, pinned):
        _assert_matches_f64(out, ref, dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(graph, eager, atol=tol, rtol=tol)
    torch.testing.assert_close(pinned, eager, atol=tol, rtol=tol)


def test_dispatcher_runs_the_recorded_plan():
    """`paged_attention_triton` on a decode step planned as engine/graphs.py records it (the
    whole page table, `decode_max_len` its width): this step's K/V land in the cache and the
    output is float64 attention over the real lengths."""
    from nitsum_kernels.paged_attention import AttentionMetadata
    from nitsum_kernels.paged_attention_triton import paged_attention_triton

    page_tokens, lens = 16, [1, 20, 100]
    q, kc, vc, pages, lens_t = _decode_case(lens, page_tokens, 2, 4, 32, torch.float32, 64, 11)
    pos = lens_t - 1
    slots = pages.gather(1, (pos // page_tokens)[:, None]).squeeze(1) * page_tokens
    slots += pos % page_tokens
    k_new, v_new = torch.randn_like(kc[:3]), torch.randn_like(vc[:3])
    meta = AttentionMetadata(
        slot_mapping=slots,
        page_tokens=page_tokens,
        n_decode=3,
        decode_pages=pages,
        decode_lens=lens_t,
        decode_max_len=pages.shape[1] * page_tokens,
        prefills=[],
    )
    out = paged_attention_triton(q, k_new, v_new, kc, vc, meta, 32**-0.5)
    assert torch.equal(kc[slots], k_new) and torch.equal(vc[slots], v_new)
    ref = _attention_f64(q, kc, vc, pages, lens_t, page_tokens, 32**-0.5)
    _assert_matches_f64(out, ref, torch.float32)


def test_decode_writes_only_decode_rows():
    """Rows past the decode queries (prefill rows of the step) are left alone."""
    case = list(_decode_case([5, 70], 16, 2, 4, 32, torch.float32, seed=5))
    q = torch.randn(5, 8, 32, device=DEV)
    q[:2] = case[0]
    case[0] = q
    for splits in (1, 3):
        out = _run(*case, 16, splits=splits)
        assert out[2:].isnan().all() and not out[:2].isnan().any()


def test_split_count_from_host_sizes():
    """Splits fill ~4 programs per SM from (batch, KV heads), never below MIN_SPLIT_TOKENS
    of the longest context, never above MAX_SPLITS."""
    cpu = torch.device("cpu")  # 132 SMs assumed off CUDA
    assert decode_splits(16, 8, 8192, cpu) == 5  # ceil(4 * 132 / 128)
    assert decode_splits(16, 8, 100, cpu) == 1
    assert decode_splits(1, 8, 8192, cpu) == 8192 // MIN_SPLIT_TOKENS
    assert decode_splits(1, 1, 1 << 20, cpu) == MAX_SPLITS
    assert decode_splits(64, 8, 1 << 20, cpu) == 2


def _nvidia_backend() -> bool:
    from triton.backends import backends

    return "nvidia" in backends


@pytest.mark.skipif(not _nvidia_backend(), reason="Triton has no NVIDIA backend here")
def test_split_kernel_compiles_to_tensor_cores():
    """Compiled for sm_90 (no GPU needed), bf16 scores and P·V run on tensor cores (MMA) with
    K/V pipelined through 16-byte async copies; fp32 keeps exact fp32 dots (no MMA); the merge
    compiles. Catches what the interpreter cannot: code that does not lower."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    helper = Path(__file__).parent / "decode_ptx.py"

    def counts(dtype: str) -> dict[str, int]:
        args = [sys.executable, str(helper), dtype, "128", "16"]
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    bf16 = counts("bf16")
    assert bf16["mma"] > 0 and bf16["cp_async_16"] > 0 and bf16["merge_stores"] > 0
    assert counts("fp32")["mma"] == 0


def test_split_counts_compile_two_merge_variants():
    """The split count grows with the context; the merge's vector over splits takes two
    sizes, and the split count itself is no compile key of either kernel."""
    from nitsum_kernels.decode_attention_triton import DECODE_UNSPECIALIZED, MAX_SPLITS, merge_block

    assert {merge_block(n) for n in range(2, MAX_SPLITS + 1)} == {16, MAX_SPLITS}
    assert all(merge_block(n) >= n for n in range(2, 200))
    assert "SPLITS" in DECODE_UNSPECIALIZED and "stride_pages" in DECODE_UNSPECIALIZED
