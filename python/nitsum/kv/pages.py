"""Page bookkeeping for every device of a pool, kept where scheduling decisions are made.

NOTE: the sequences of a TP group use the same page ids on every member device, so one
page list per sequence describes its KV on all ranks and every rank runs identical step
inputs. A group therefore allocates only ids that are free on all its members.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from nitsum.config import kv_split


def tokens_per_page(base_page_tokens: int, shards: int) -> int:
    """Tokens a page holds in a layout of `shards` distinct KV-head shards (`config.kv_split`
    of the TP degree: the degree itself, or the KV heads when it replicates them).

    NOTE: a page has a fixed size in bytes; a device stores `kv_heads / shards` heads per
    token, so the same page holds `shards` times the tokens it holds at TP 1.
    """
    return base_page_tokens * shards


class OutOfPages(RuntimeError):
    """The group cannot supply the pages asked for."""


class PageAllocator:
    """Free/used state of `num_pages` pages on each of `num_devices` devices."""

    def __init__(
        self,
        num_devices: int,
        num_pages: int,
        base_page_tokens: int,
        num_kv_heads: int,
    ) -> None:
        self.num_pages = num_pages
        self.base_page_tokens = base_page_tokens
        # The model's KV heads: a TP level above them replicates heads, so its pages hold no
        # more tokens than at TP = num_kv_heads.
        self.num_kv_heads = num_kv_heads
        self.free = np.ones((num_devices, num_pages), dtype=bool)
        # Copies in flight that read or write each page (engine/swap.py): a free page that is
        # held is handed out only once they are done.
        self.held = np.zeros((num_devices, num_pages), dtype=np.int32)
        # Holds in force (page · device · copy): 0 says "nothing is held" without a pass.
        self.holds = 0
        # Bumped by every change of `free` (`mark`): a group's cached count of its free pages
        # is valid while it saw the same version.
        self.version = 0

    def group(self, members: tuple[int, ...], tp: int) -> GroupPages:
        """The view of the group `members`, whose KV is split `tp` ways (a pipeline's
        stages of `tp` devices each use the same page ids; `parallel.topology.GroupShape`)."""
        return GroupPages(self, members, tp)

    def tokens_per_page(self, tp: int) -> int:
        """Tokens per page in a group of `tp` devices."""
        return tokens_per_page(self.base_page_tokens, kv_split(self.num_kv_heads, tp))

    def used(self, device: int) -> set[int]:
        return set(np.flatnonzero(~self.free[device]).tolist())

    def num_free(self, device: int) -> int:
        return int(self.free[device].sum())

    def mark(self, members: list[int], ids: list[int], free: bool) -> None:
        """Set pages `ids` free (or used) on every device of `members`.
        NOTE: the one writer of `free` (it keeps `version` in step)."""
        self.free[np.ix_(members, ids)] = free
        self.version += 1


class GroupPages:
    """A group's view of the allocator: the pages of one engine's group (the `members` and
    `tp` of a `parallel.topology.GroupShape`), mirrored on all `members`.

    NOTE: in a pipeline (`tp` < len(members)) every stage uses the same page ids and writes
    only its own layers' part of them, so a page holds the tokens of its stage's TP degree.
    """

    def __init__(self, alloc: PageAllocator, members: tuple[int, ...], tp: int) -> None:
        self.alloc = alloc
        self.members = list(members)
        self.tp = tp
        # Waits for the copies in flight (their held pages become free to hand out); set by
        # the group's swap manager, None: nothing is ever held.
        self.settle: Callable[[], None] | None = None
        # (allocator version, pages free on all members then): `num_free` without a pass
        # over every page each time the scheduler asks (it asks per running sequence).
        self._counted: tuple[int, int] = (-1, 0)

    @property
    def num_pages(self) -> int:
        return self.alloc.num_pages

    @property
    def tokens_per_page(self) -> int:
        """Tokens per page at this group's TP degree (pages hold fewer heads per token)."""
        return self.alloc.tokens_per_page(self.tp)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_page)

    def _free_mask(self) -> np.ndarray:
        return np.asarray(self.alloc.free[self.members].all(axis=0))

    @property
    def num_ready(self) -> int:
        """Free pages no copy in flight holds: what `allocate` hands out without waiting.
        NOTE: a pass over the pool only while something is held."""
        if self.alloc.holds == 0:
            return self.num_free
        return int((self._free_mask() & ~self._held_mask()).sum())

    def ready_at_least(self, n: int) -> bool:
        """Whether `n` pages are ready (`num_ready` >= n); a pass over the pool only when the
        holds in force could make the difference."""
        free = self.num_free
        if n <= free - self.alloc.holds:
            return True
        return n <= free and self.num_ready >= n

    @property
    def num_free(self) -> int:
        version, count = self._counted
        if version != self.alloc.version:
            count = int(self._free_mask().sum())
            self._counted = (self.alloc.version, count)
        return count

    def _mark(self, ids: list[int], free: bool) -> None:
        """Set `ids` free or used on every member, keeping the cached count current."""
        ids = list(dict.fromkeys(ids))  # NOTE: a repeated id would count twice below
        members = self.members
        current = self._counted[0] == self.alloc.version
        if current:
            was_free = int(self.alloc.free[np.ix_(members, ids)].all(axis=0).sum())
        self.alloc.mark(members, ids, free)
        if current:
            count = self._counted[1] + (len(ids) - was_free if free else -was_free)
            self._counted = (self.alloc.version, count)

    def allocate(self, n: int, after: int | None = None) -> list[int]:
        """`n` pages, in as few runs of consecutive ids as the free pages allow (`page_runs`);
        with `after` (a sequence's last page), the pages right after it first, so a sequence
        that grows keeps extending its run.

        NOTE (coarse page groups, FastSwitch §3.2): a sequence whose pages form a few runs
        moves (swap, migration) in a few large copies instead of one per page.
        """
        if n <= 0:
            return []
        if after is not None and after + n < self.num_pages:
            # NOTE (the common case): a growing sequence's next pages are free and not held:
            # take them without a pass over every page. Same ids as `page_runs` would give.
            ids = list(range(after + 1, after + 1 + n))
            rows = np.ix_(self.members, ids)
            if self.alloc.free[rows].all() and not self.alloc.held[rows].any():
                self._mark(ids, False)
                return ids
        free = self._free_mask()
        ids = page_runs(free & ~self._held_mask(), n, after)
        if len(ids) < n and self.settle is not None and int(free.sum()) >= n:
            # NOTE: the free pages left are held by copies in flight: wait for them.
            self.settle()
            ids = page_runs(self._free_mask() & ~self._held_mask(), n, after)
        if len(ids) < n:
            raise OutOfPages(f"asked for {n} pages, {len(ids)} free on all of {self.members}")
        self._mark(ids, False)
        return ids

    def release(self, pages: list[int]) -> None:
        if pages:
            self._mark(pages, True)

    def _held_mask(self) -> np.ndarray:
        return np.asarray((self.alloc.held[self.members] > 0).any(axis=0))

    def hold(self, pages: list[int]) -> None:
        """Copies in flight use `pages`: hand none of them out (once free) until `unhold`."""
        for d in self.members:
            np.add.at(self.alloc.held[d], pages, 1)
        self.alloc.holds += len(pages) * len(self.members)

    def unhold(self, pages: list[int]) -> None:
        for d in self.members:
            np.subtract.at(self.alloc.held[d], pages, 1)
        self.alloc.holds -= len(pages) * len(self.members)


def free_runs(free: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of every maximal run of free pages, in id order."""
    padded = np.concatenate(([False], free, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    starts, ends = edges[::2], edges[1::2]
    return list(zip(starts.tolist(), (ends - starts).tolist(), strict=True))


def page_runs(free: np.ndarray, n: int, after: int | None = None) -> list[int]:
    """Up to `n` free page ids: first those right after `after` while they are free, then
    the smallest free run that holds the rest (best fit), else the largest runs first."""
    out: list[int] = []
    if after is not None:
        p = after + 1
        while len(out) < n and p < len(free) and free[p]:
            out.append(p)
            p += 1
    need = n - len(out)
    if need == 0:
        return out
    taken = set(out)
    runs = [(s, ln) for s, ln in free_runs(free) if s not in taken]
    fits = [r for r in runs if r[1] >= need]
    if fits:
        start, _ = min(fits, key=lambda r: (r[1], r[0]))
        return out + list(range(start, start + need))
    for start, length in sorted(runs, key=lambda r: (-r[1], r[0])):
        take = min(length, n - len(out))
        out += range(start, start + take)
        if len(out) == n:
            break
    return out


def context_slots(
    pages: list[int], length: int, tokens_per_page: int, start: int = 0
) -> torch.Tensor:
    """Slots of positions [start, length) for a sequence owning `pages`."""
    pos = torch.arange(start, length)
    first = start // tokens_per_page
    table = torch.tensor(pages[first : -(-length // tokens_per_page)], dtype=torch.long)
    return table[pos // tokens_per_page - first] * tokens_per_page + pos % tokens_per_page
