"""A device's paged KV pool: fixed-size pages whose token capacity scales with TP.

A page holds `page_elems` elements per layer for K and for V. At TP p a rank stores
`kv_heads / p` heads per token, so one page holds `p ×` the tokens it holds at TP 1
(Flying Serving's KV adaptor). The pool itself never changes shape on a TP switch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nitsum.config import ModelConfig


@dataclass(frozen=True)
class KVLayout:
    """The (TP degree, rank) a request's KV was written under."""

    tp: int = 1
    rank: int = 0


class OutOfPages(RuntimeError):
    """The pool cannot supply the pages asked for."""


class KVPool:
    """Pages of K/V for every layer, plus a free list.

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
    ) -> None:
        if num_pages < 1 or page_tokens < 1:
            raise ValueError("num_pages and page_tokens must be >= 1")
        self.cfg = cfg
        self.num_pages = num_pages
        self.base_page_tokens = page_tokens
        self.page_elems = page_tokens * cfg.num_kv_heads * cfg.head_dim
        self.storage = torch.zeros(
            cfg.num_layers, 2, num_pages, self.page_elems, dtype=dtype, device=device
        )
        # Popping from the end hands out low page ids first, which keeps tests readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @classmethod
    def for_bytes(
        cls, cfg: ModelConfig, nbytes: int, page_tokens: int = 16, **kw: object
    ) -> KVPool:
        """A pool of about `nbytes` bytes (all layers, K and V)."""
        dtype = kw.get("dtype", torch.float32)
        per_page = 2 * cfg.num_layers * page_tokens * cfg.num_kv_heads * cfg.head_dim
        per_page *= torch.tensor([], dtype=dtype).element_size()  # type: ignore[arg-type]
        return cls(cfg, max(1, nbytes // per_page), page_tokens, **kw)  # type: ignore[arg-type]

    @property
    def page_bytes(self) -> int:
        """Bytes of one page in one layer for K (the same for V)."""
        return self.page_elems * self.storage.element_size()

    def tokens_per_page(self, tp: int) -> int:
        return self.base_page_tokens * tp

    def pages_for(self, tokens: int, tp: int) -> int:
        tpp = self.tokens_per_page(tp)
        return (tokens + tpp - 1) // tpp

    def kv(self, layer: int, local_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat (slots, local_kv_heads, head_dim) views of one layer's K and V pages."""
        shape = (-1, local_kv_heads, self.cfg.head_dim)
        return self.storage[layer, 0].view(shape), self.storage[layer, 1].view(shape)

    # -- allocation -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        pages = self._free[len(self._free) - n :][::-1]
        del self._free[len(self._free) - n :]
        return pages

    def release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))

    def free_page_ids(self) -> set[int]:
        return set(self._free)
