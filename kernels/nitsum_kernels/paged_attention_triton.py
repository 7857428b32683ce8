"""Triton paged attention for CUDA; same contract as `paged_attention.paged_attention_ref`.

The kernels read K/V in place from the pool through a page table (no gather of the
context): a key at position `pos` of a sequence lives in slot
`pages[pos // page_tokens] * page_tokens + pos % page_tokens`. They step over positions in
blocks of `BLOCK_N`, so any page size works (a TP level that packs 3× the tokens into a page
makes 48-token pages). Softmax is online and in fp32; GQA maps query head h to KV head
h // (q_heads / kv_heads).

- decode: flash-decoding over context splits, in `decode_attention_triton.py`.
- prefill: `prefill_attention_triton.py` (one launch for every chunk of the step, tensor
  cores in bf16/fp16).

Tests run them on CPU under `TRITON_INTERPRET=1` against the torch reference.
"""

from __future__ import annotations

import contextlib

import torch

from nitsum_kernels.decode_attention_triton import decode_attention_triton
from nitsum_kernels.paged_attention import AttentionMetadata
from nitsum_kernels.prefill_attention_triton import prefill_attention_triton


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_written: bool = False,
) -> torch.Tensor:
    """`paged_attention_ref`'s contract with the Triton kernels: write this step's K/V into
    the cache, then attend in place over the pages.

    NOTE: `kv_written=True`: the caches already hold this step's K/V at `meta.slot_mapping`
    (the model's fused rotary kernel wrote them, kernels/fused_ops_triton.py); k and v are
    then not read (pass None) and nothing is written here."""
    if not kv_written:
        assert k is not None and v is not None
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
    # NOTE: the kernels address `out` with q's strides and head dims with unit stride.
    q = q.contiguous()
    out = torch.empty_like(q)
    assert k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride()
    # Triton launches on the current device: make it the tensors'.
    on_device = torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext()
    with on_device:
        decode_attention_triton(
            q,
            k_cache,
            v_cache,
            meta.decode_pages,
            meta.decode_lens,
            meta.page_tokens,
            scale,
            out,
            meta.decode_max_len,
        )
        prefill_attention_triton(q, k_cache, v_cache, meta, scale, out)
    return out
