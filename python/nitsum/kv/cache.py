"""A device's paged KV pool: fixed-size pages whose token capacity scales with TP.

A page holds `page_elems` elements per layer for K and for V. At TP p a rank stores
`kv_heads_per_rank(p)` heads per token, so one page holds `kv_split(p) ×` the tokens it holds
at TP 1 (Flying Serving's KV adaptor; `p ×` unless p replicates KV heads). The pool itself
never changes shape on a TP switch.
"""

from __future__ import annotations

import torch

from nitsum.config import ModelConfig
from nitsum.kv.pages import tokens_per_page


class KVCache:
    """One device's K/V pages for every layer (storage only; see `pages.py` for allocation).

    NOTE: a page id names the same page in every layer and in both K and V, so one page
    list per request is enough.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        num_pages: int,
        page_tokens: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        scratch_page: bool = False,
        memory: torch.Tensor | None = None,
    ) -> None:
        """`memory`: flat uint8 bytes to lay the pages in (`storage_bytes` of them; a buffer the
        host's other device processes map, pool/shared_kv.py), zeroed; None: allocate."""
        if num_pages < 1 or page_tokens < 1:
            raise ValueError("num_pages and page_tokens must be >= 1")
        self.cfg = cfg
        self.num_pages = num_pages
        self.base_page_tokens = page_tokens
        self.page_elems = page_tokens * cfg.num_kv_heads * cfg.head_dim
        # One page past the allocator's, owned by no sequence: padding rows of a recorded
        # decode step write their K/V there (engine/graphs.py).
        self.scratch_page: int | None = num_pages if scratch_page else None
        shape = (cfg.num_layers, 2, num_pages + int(scratch_page), self.page_elems)
        if memory is None:
            self.storage = torch.zeros(shape, dtype=dtype, device=device)
        else:
            self.storage = memory.view(dtype).view(shape)

    @staticmethod
    def storage_bytes(
        cfg: ModelConfig, num_pages: int, page_tokens: int, dtype: torch.dtype, scratch: bool
    ) -> int:
        """Bytes of a pool's storage: every page (and the scratch page) of every layer."""
        return (num_pages + int(scratch)) * KVCache.page_bytes_of(cfg, page_tokens, dtype)

    @staticmethod
    def pages_in(cfg: ModelConfig, nbytes: int, page_tokens: int, dtype: torch.dtype) -> int:
        """How many pages (all layers, K and V) fit in about `nbytes` bytes."""
        return max(1, nbytes // KVCache.page_bytes_of(cfg, page_tokens, dtype))

    @staticmethod
    def page_bytes_of(cfg: ModelConfig, page_tokens: int, dtype: torch.dtype) -> int:
        """Bytes of one page on one device: all layers, K and V."""
        return 2 * cfg.num_layers * page_tokens * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize

    @property
    def bytes_per_page(self) -> int:
        """Bytes of one page on this device: all layers, K and V (`page_bytes_of`)."""
        return 2 * self.cfg.num_layers * self.page_bytes

    @property
    def page_bytes(self) -> int:
        """Bytes of one page in one layer for K (the same for V)."""
        return self.page_elems * self.storage.element_size()

    def tokens_per_page(self, tp: int) -> int:
        """Tokens one page holds at TP `tp`."""
        return tokens_per_page(self.base_page_tokens, self.cfg.kv_split(tp))

    def kv(self, layer: int, local_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat (slots, local_kv_heads, head_dim) views of one layer's K and V pages."""
        shape = (-1, local_kv_heads, self.cfg.head_dim)
        return self.storage[layer, 0].view(shape), self.storage[layer, 1].view(shape)
