"""Where a TP group's sequences keep their KV: device pages, the prefix cache, the host tier.

The scheduler decides who runs and who gives way; this is how a sequence's KV follows those
decisions: a prompt starts after its longest cached prefix (loading pages the cache moved to
host back first), a preempted sequence's KV goes to host or is dropped, its full pages stay
cached either way, and a sequence coming back copies from host only what the device lost.

NOTE: a page a sequence owns holds KV for its tokens from `num_computed` down; cached pages
it shares are read-only (kv/prefix_cache.py). A swapped-out sequence's `host_pages` hold
its first `num_computed` tokens. Copies are planned here and run by the swap manager
(engine/swap.py).
"""

from __future__ import annotations

from nitsum.engine.sequence import Sequence
from nitsum.engine.swap import SwapSpace
from nitsum.kv.pages import GroupPages, OutOfPages
from nitsum.kv.prefix_cache import PrefixCache

# With a host tier, the pages kept free ahead of need by moving idle cached pages to host
# (`KVSpace.write_back`): 1/32 of the pool, or a full step's worth if more, at most a quarter.
WRITE_BACK_SHARE = 32


class KVSpace:
    """A group's device pages (`pages`), prefix cache (`cache`, None: off) and host tier
    (`swap`, None: preemption always recomputes)."""

    def __init__(
        self,
        pages: GroupPages,
        cache: PrefixCache | None,
        swap: SwapSpace | None,
        step_tokens: int = 0,
    ) -> None:
        self.pages = pages
        self.cache = cache
        self.swap = swap
        share = max(pages.num_pages // WRITE_BACK_SHARE, pages.pages_for(step_tokens))
        self.ahead = max(1, min(pages.num_pages // 4, share))
        # Whether pages an allocation needs now may move to host (it then waits for their
        # copies): yes while no step is in flight when the scheduler runs (synchronous
        # steps); an overlapped engine turns it off (engine/overlap.py), see `reclaim`.
        self.demote_on_demand = True

    # -- a sequence starting or coming back -----------------------------------------------------
    def reuse_prefix(self, seq: Sequence) -> None:
        """Start a sequence with nothing computed after the longest cached prefix of its
        tokens (its pages are shared, read-only); a swapped-out one takes back its pages the
        device still caches."""
        tokens = seq.prompt_ids + seq.output_ids
        if seq.host_pages:
            # NOTE: a sequence still scoring its prompt takes no cached pages past what it
            # computed (nothing may skip a position it has to score): it copies its own back.
            if self.cache is not None and not seq.scores_prompt:
                seq.pages = self.cache.match(tokens, salt=seq.spec.cache_salt)
            cached = len(seq.pages) * self.pages.tokens_per_page
            if cached >= seq.num_computed:  # the device still holds all it had, or more
                seq.num_computed = cached
                self.release_host(seq)
            return
        if self.cache is None or seq.num_computed or seq.pages or seq.scores_prompt:
            return
        load = self._load if self.swap is not None else None
        seq.pages = self.cache.match(tokens, load, salt=seq.spec.cache_salt)
        seq.num_computed = len(seq.pages) * self.pages.tokens_per_page
        if seq.cached_tokens is None:  # NOTE: the first admission's hit is what usage reports
            seq.cached_tokens = seq.num_computed

    def publish(self, seq: Sequence) -> int:
        """Share `seq`'s computed prompt pages through the prefix cache while it runs (its
        n > 1 sibling choices reuse them instead of prefilling again); tokens shared."""
        if self.cache is None or seq.loading:
            return 0
        computed = min(seq.num_computed, len(seq.prompt_ids))
        return self.cache.publish(seq.pages, seq.prompt_ids, computed, seq.spec.cache_salt)

    def allocate(self, seq: Sequence, tokens: int) -> bool:
        """Give `seq` pages for `tokens` tokens if free (or idle cached) ones allow."""
        need = self.pages.pages_for(tokens) - len(seq.pages)
        if need <= 0:
            return True
        if not self.pages.ready_at_least(need):
            self.reclaim(need)  # NOTE: idle cached pages go first, before anybody's KV
        if need > self.pages.num_free:
            return False
        try:
            new = self.pages.allocate(need, seq.pages[-1] if seq.pages else None)
        except OutOfPages:  # free, but held by another group's copies in flight
            return False
        seq.pages.extend(new)
        return True

    def swap_in(self, seq: Sequence, cached: int, others: int, step_s: float | None) -> bool:
        """Copy back `seq`'s host pages past its `cached` ones still on the device (into the
        pages it was just given); True if synchronously, in this step with `others`, False if
        it waits for the copy (`Sequence.loading`)."""
        assert self.swap is not None
        host = seq.host_pages
        sync = self.swap.sync_is_cheaper(len(host) - cached, others, step_s)
        self.swap.swap_in(seq, host[cached:], seq.pages[cached : len(host)], sync)
        self.release_host(seq)
        return sync

    def _load(self, host_page: int) -> int | None:
        """A device page for a cached prefix page on host, copied back before this step's
        forward (None: no room for it). An idle cached page may give way (to host)."""
        assert self.swap is not None
        self.reclaim(1)
        if self.pages.num_free == 0:
            return None
        try:
            (page,) = self.pages.allocate(1)
        except OutOfPages:  # free, but held by another group's copies in flight
            return None
        self.swap.load(host_page, page)
        return page

    # -- a sequence giving way ------------------------------------------------------------------
    def swap_is_cheaper(self, seq: Sequence, step_s: float | None, budget: int) -> bool:
        """Swap `seq` out rather than recompute it later: its KV fits the host tier and two
        copies of its pages cost less than prefilling its tokens again (`budget` tokens a
        full step of `step_s` seconds; None: no step timed yet)."""
        if self.swap is None or seq.num_computed == 0 or not seq.pages:
            return False
        host_cached = self.cache.num_host if self.cache is not None else 0
        if self.swap.host.num_free + host_cached < len(seq.pages):
            return False
        if step_s is None:  # swap what is longer than a few pages
            return seq.num_computed >= 4 * self.pages.tokens_per_page
        recompute_s = seq.num_computed / budget * step_s
        return 2 * self.swap.seconds(len(seq.pages)) < recompute_s

    def swap_out(self, seq: Sequence) -> bool:
        """Copy `seq`'s KV to host and let its device pages go (False: no room on host)."""
        if self.swap is None or not self._host_room(len(seq.pages)):
            return False
        seq.host_pages = self.swap.swap_out(seq.pages)
        self.free_device(seq)
        return True

    def _host_room(self, pages: int) -> bool:
        """Free `pages` host pages, evicting cached prefix pages on host if need be."""
        assert self.swap is not None
        short = pages - self.swap.host.num_free
        if short > 0 and self.cache is not None:
            self.swap.host.release(self.cache.evict_host(short))
        return self.swap.host.num_free >= pages

    def _demote(self, page: int) -> int | None:
        """A host page for an idle cached page evicted from the device, copied out by the
        next ticket (None: no host tier or no room; the page's entry is dropped)."""
        if self.swap is None or self.cache is None or not self._host_room(1):
            return None
        return self.swap.swap_out([page])[0]

    # -- letting go -----------------------------------------------------------------------------
    def release_host(self, seq: Sequence) -> None:
        """Free `seq`'s host pages once this step's copies have started."""
        if self.swap is not None:
            self.swap.free_after_start(seq.host_pages)
        seq.host_pages = []

    def free_device(self, seq: Sequence) -> None:
        """Let go of a sequence's device pages: its full computed ones stay cached."""
        if seq.loading and self.swap is not None:
            self.swap.wait(seq)  # NOTE: its pages are not valid (cacheable) before that
        if self.cache is None:
            self.pages.release(seq.pages)
        else:
            tokens = seq.prompt_ids + seq.output_ids
            salt = seq.spec.cache_salt
            self.pages.release(self.cache.release(seq.pages, tokens, seq.num_computed, salt))
        seq.pages = []

    def free(self, seq: Sequence) -> None:
        """Let go of everything a sequence holds, on the device and on host."""
        self.free_device(seq)
        if seq.host_pages and self.swap is not None:
            self.swap.host.release(seq.host_pages)
            seq.host_pages = []

    def reclaim(self, pages: int) -> None:
        """Evict idle cached pages until `pages` are free (or nothing idle is left), to
        the host tier if there is one; then move more there ahead of need (`write_back`).

        NOTE (`demote_on_demand` off, overlapped steps): the pages needed now are dropped,
        not moved to host, until `pages` are ready (free and held by no copy). A page
        moving to host is held until its copy is done, and the copy runs after the device's
        step in flight: handing it out would stop the host until the device is idle, every
        time an admission finds the pool full of cached prefixes (the 2026-11-27 H200 run,
        30 GB pool). Pages move to host ahead of need instead, while nobody waits for them.
        """
        if self.cache is None:
            return
        if self.demote_on_demand:
            while self.pages.num_free < pages and self.cache.num_evictable:
                self.pages.release(self.cache.evict(pages - self.pages.num_free, self._demote))
        else:
            short = pages - self.pages.num_ready
            if short > 0 and self.cache.num_evictable:
                self.pages.release(self.cache.evict(short))
        self.write_back(pages)

    def write_back(self, needed: int = 0) -> None:
        """With a host tier, move least recently used idle cached pages there until `needed`
        plus `ahead` pages are free (ready, or being copied out): later allocations then find
        ready pages, and a later prompt can still reuse what moved. The scheduler calls it
        after each step's plan (its copies start with the step).

        NOTE (what it leaves alone):
        - `ahead` idle cached pages stay on the device: a page moving to host is held until
          its copy is done, and an allocation that found only held pages would wait for the
          copy; idle pages can be dropped at once instead (`reclaim`).
        - only free host pages, at most a quarter of the host tier a call: moving a page
          before it is needed must not push out of the host a page moved earlier, which a
          later prompt may still want (an allocation that needs pages now may, `reclaim`).
        """
        if self.cache is None or self.swap is None:
            return
        want = needed + self.ahead - self.pages.num_free
        host = self.swap.host
        idle = self.cache.num_evictable - self.ahead
        want = min(want, idle, host.num_free, host.num_pages // 4)
        if want <= 0:
            return
        # One host allocation and one planned copy for the lot (not a pass per page).
        hosts = iter(self.swap.swap_out(self.cache.lru_pages(want)))
        self.pages.release(self.cache.evict(want, lambda page: next(hosts)))

    def num_reclaimable(self) -> int:
        """Pages free now or as soon as asked (idle cached pages)."""
        return self.pages.num_free + (self.cache.num_evictable if self.cache else 0)

    def flush(self) -> int:
        """Drop the prefix cache's idle pages, on the device and on host (`/flush_cache`);
        returns how many device pages went back to the allocator.

        NOTE: pages a running sequence references stay (and stay matchable) until it
        releases them: flushing never touches a request in flight."""
        if self.cache is None:
            return 0
        if self.swap is not None:
            self.swap.settle()  # no copy may still target a page dropped here
        freed = self.cache.clear()
        self.pages.release(freed)
        if self.swap is not None:
            self.swap.host.release(self.cache.evict_host(self.cache.num_host))
        return len(freed)

    def close(self) -> None:
        """The group is going away: finish its copies, give its idle cached pages back."""
        if self.swap is not None:
            self.swap.settle()
        if self.cache is not None:
            self.pages.release(self.cache.clear())
            if self.swap is not None:
                self.swap.host.release(self.cache.evict_host(self.cache.num_host))
