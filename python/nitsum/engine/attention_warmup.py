"""Compile a context's attention kernel variants at start-up instead of in a serving step.

Triton compiles a kernel the first time it meets a new combination of its compile-time
sizes (kernels/prefill_attention_triton.py and decode_attention_triton.py keep those few:
the prefill tile by the step's longest chunk, two sizes of the chunk vector; one split or
several, two sizes of the merge). A compile takes about a second, and a step that meets one
waits for it: in a bursty run the first steps of each kind would stall the whole batch.
`warm_attention` runs layer 0's attention once per combination a step can produce, over the
KV pool's scratch page (no sequence owns it), with the step shapes' own sizing functions, so
it compiles exactly what serving would.

NOTE: the output is thrown away; the scratch page's K/V may be anything (even non-finite).
"""

from __future__ import annotations

import torch

from nitsum.kv.cache import KVCache
from nitsum.models.llama import LlamaModel
from nitsum.parallel.context import TPContext
from nitsum_kernels.decode_attention_triton import decode_splits, merge_block
from nitsum_kernels.paged_attention import AttentionMetadata, PrefillSegment
from nitsum_kernels.prefill_attention_triton import chunk_block, prefill_blocks

# Longest decode contexts that give one split, a few and many (decode_splits: a split is at
# least 256 tokens; merge_block changes size past 16 splits) at batch 1.
DECODE_LENGTHS = (200, 1000, 4500)


def chunk_counts(max_chunks: int) -> list[int]:
    """A chunk count of each size of the prefill kernel's chunk vector (`chunk_block`) up to
    `max_chunks` (a step's chunks are at most its sequences: the batch cap)."""
    counts, n = [1], 17
    while n <= max(max_chunks, 17):
        counts.append(n)
        n = max(257, 2 * n - 1)  # 17, 257, 513, ...: each next vector size's smallest count
    return counts


def prefill_variants(
    head_dim: int, group: int, dtype: torch.dtype, hopper: bool, max_chunks: int
) -> dict[tuple[int, int], tuple[int, int]]:
    """{(prefill tile rows, chunk vector size): (chunk length, chunk count) of a step that
    compiles it} for every tile a step's longest chunk can give and every vector size up to
    `max_chunks` chunks."""
    lengths: dict[int, int] = {}
    q_len = 1
    while q_len <= 1 << 14:  # NOTE: the tile stops growing long before this
        block_m = prefill_blocks(head_dim, group, dtype, q_len, hopper).block_m
        lengths.setdefault(block_m, q_len)
        q_len *= 2
    counts = chunk_counts(max_chunks)
    return {(m, chunk_block(n)): (q, n) for m, q in lengths.items() for n in counts}


def decode_variants(kv_heads: int, device: torch.device) -> dict[tuple[bool, int], int]:
    """{(one split, merge vector size): a decode length at batch 1 that gives it}."""
    out: dict[tuple[bool, int], int] = {}
    for length in DECODE_LENGTHS:
        splits = decode_splits(1, kv_heads, length, device)
        out.setdefault((splits == 1, merge_block(splits)), length)
    return out


def warm_attention(model: LlamaModel, ctx: TPContext, kv: KVCache, max_chunks: int) -> int:
    """Run layer 0's attention under `ctx` once per kernel variant a step of at most
    `max_chunks` prompt chunks can need; returns how many calls ran. Needs the pool's scratch
    page (a pool that records steps has one)."""
    scratch = kv.scratch_page
    if scratch is None:
        raise ValueError("warming attention up needs a KV pool with a scratch page")
    heads = ctx.heads
    k_cache, v_cache = kv.kv(0, heads.kv_heads)
    page = kv.tokens_per_page(ctx.tp)
    dev, dtype, hd = k_cache.device, model.dtype, model.cfg.head_dim
    group = heads.q_heads // heads.kv_heads
    hopper = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    prefill = prefill_variants(hd, group, dtype, hopper, max_chunks).values()
    decode = decode_variants(heads.kv_heads, dev).values()
    steps = [_step(page, scratch, dev, [], [q_len] * n) for q_len, n in prefill]
    steps += [_step(page, scratch, dev, [length], []) for length in decode]
    for meta in steps:
        rows = meta.slot_mapping.shape[0]
        q = torch.zeros(rows, heads.q_heads, hd, dtype=dtype, device=dev)
        model.paged_attention(q, None, None, k_cache, v_cache, meta, model.scale, kv_written=True)
    return len(steps)


def _step(
    page: int, scratch: int, dev: torch.device, decode_lens: list[int], chunks: list[int]
) -> AttentionMetadata:
    """A step of decode rows of `decode_lens` and fresh prompt chunks of lengths `chunks`,
    every page of every context the scratch page."""
    pages = lambda n: torch.full((-(-n // page),), scratch, dtype=torch.long, device=dev)  # noqa: E731
    segs, row = [], len(decode_lens)
    for q_len in chunks:
        segs.append(PrefillSegment(row, q_len, q_len, pages(q_len)))
        row += q_len
    width = max((-(-n // page) for n in decode_lens), default=0)
    return AttentionMetadata(
        slot_mapping=torch.full((row,), scratch * page, dtype=torch.long, device=dev),
        page_tokens=page,
        n_decode=len(decode_lens),
        decode_pages=torch.full((len(decode_lens), width), scratch, dtype=torch.long, device=dev),
        decode_lens=torch.tensor(decode_lens, dtype=torch.long).to(dev),
        decode_max_len=max(decode_lens, default=0),
        prefills=segs,
    )
