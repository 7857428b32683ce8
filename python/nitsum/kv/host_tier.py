"""A device's host KV tier: where the KV of swapped-out sequences waits (FastSwitch §3).

Host pages have the device pages' size and layout (`KVCache.storage`: layers × K/V × pages ×
elements), so a swap is a copy of page ranges between the two tensors: host memory is pinned
on CUDA (asynchronous DMA), a plain separate buffer on CPU devices, with the same path and
bookkeeping. Runs of consecutive page ids move as one copy (`runs`), so a sequence whose
pages were allocated together moves in a few large copies instead of one per page.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nitsum.kv.cache import KVCache

# (source page, destination page) pairs of one direction of a swap.
PageCopies = list[tuple[int, int]]


def runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of the maximal runs where both id lists step by one."""
    out: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, d, 1))
    return out


@dataclass
class SwapStats:
    """What one swap call moved."""

    bytes: int = 0
    copies: int = 0


def host_pages_in(nbytes: int, page_bytes: int) -> int:
    """Host pages of `page_bytes` bytes (a device page: `KVCache.bytes_per_page`) that fit in
    `nbytes` (0 bytes: no host tier)."""
    return nbytes // page_bytes if nbytes > 0 else 0


class HostKVTier:
    """`num_pages` host pages shaped like `pool`'s device pages."""

    def __init__(self, pool: KVCache, num_pages: int) -> None:
        pinned = pool.storage.is_cuda
        shape = (*pool.storage.shape[:2], num_pages, pool.storage.shape[3])
        # NOTE: committed now (pinned memory is; on CPU `zero_` touches every page): left to
        # the first swap-out of each page, the process grew by the tier's size page by page
        # as the prefix cache spilled, which looked like a leak for as long as it took to fill
        # (issue 40: 15-55 MiB per round of 200 cut streams). A page is read only after a
        # swap-out wrote it, so the zeros are never seen.
        self.storage = torch.empty(shape, dtype=pool.storage.dtype, device="cpu", pin_memory=pinned)
        if not pinned:
            self.storage.zero_()
        self.pool = pool
        self.num_pages = num_pages

    def swap(self, out: PageCopies, into: PageCopies) -> SwapStats:
        """Copy device page → host page for each pair of `out`, then host → device for each
        pair of `into` (NOTE: in that order: a page swapped out may be swapped into in the
        same call)."""
        stats = SwapStats()
        dev = self.pool.storage
        for pairs, src, dst in ((out, dev, self.storage), (into, self.storage, dev)):
            if not pairs:
                continue
            for s, d, n in runs([p[0] for p in pairs], [p[1] for p in pairs]):
                dst[:, :, d : d + n].copy_(src[:, :, s : s + n], non_blocking=dev.is_cuda)
                stats.copies += 1
                stats.bytes += n * self.pool.bytes_per_page
        if dev.is_cuda:
            torch.cuda.current_stream(dev.device).synchronize()
        return stats
