"""What a pool's KV pages hold: free pages per device, the usage gauges, and the accounting.

Cached prefix pages no sequence uses count as free: a group takes them back as soon as it
needs them. The gauges go to the router in `stats` (worker/stats.py); the accounting is the
invariant tests check after every switch, failure and hand-off (used pages = owned pages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nitsum.engine.engine import Engine
    from nitsum.kv.pages import PageAllocator
    from nitsum.parallel.topology import GroupShape
    from nitsum.pool.devices import Devices


class PagedPool(Protocol):
    """What the page queries need of the PoolEngine."""

    pool: Devices
    alloc: PageAllocator
    host_alloc: PageAllocator | None

    def every_engine(self) -> list[tuple[GroupShape, Engine]]: ...


def free_pages(pe: PagedPool, device: int) -> int:
    """Pages of `device` free now or as soon as its group needs them (idle cached ones)."""
    cached = sum(e.num_evictable() for g, e in pe.every_engine() if g.holds(device))
    return pe.alloc.num_free(device) + cached


def usage(pe: PagedPool) -> dict[str, int]:
    """Gauges, vLLM-style: device KV pages in use (`kv_cache_usage_perc`) and host-tier
    pages in use (`host_kv_usage_perc`), percent over all devices; cached prefix pages
    no sequence uses count as free on both."""
    pages = pe.alloc.num_pages * pe.pool.num_devices
    free = sum(free_pages(pe, d) for d in range(pe.pool.num_devices))
    out = {"kv_cache_usage_perc": round(100 * (pages - free) / pages)}
    if pe.host_alloc is not None:
        host = pe.host_alloc.num_pages * pe.pool.num_devices
        host_free = sum(pe.host_alloc.num_free(d) for d in range(pe.pool.num_devices))
        host_free += sum(e.num_host_cached() * g.size for g, e in pe.every_engine())
        out["host_kv_usage_perc"] = round(100 * (host - host_free) / host)
    return out


def page_accounting(pe: PagedPool) -> dict[int, tuple[set[int], set[int]]]:
    """Per device: (pages marked used, pages owned by live sequences or held by a
    group's prefix cache). Must be equal."""
    owned: dict[int, set[int]] = {d: set() for d in range(pe.pool.num_devices)}
    for group, engine in pe.every_engine():
        for seq in engine.sequences():
            for d in seq.layout.members:
                owned[d] |= set(seq.pages)
        for d in group.members:
            owned[d] |= engine.cached_pages()
    return {d: (pe.alloc.used(d), owned[d]) for d in owned}
