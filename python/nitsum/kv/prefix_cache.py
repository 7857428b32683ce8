"""Prefix reuse: the KV pages of finished (or preempted) sequences stay on the device, keyed
by the tokens they hold, so a later prompt that starts with the same tokens skips that prefill
(a second conversation turn pays only for the new tokens).

One cache per TP group: a page holds `tokens_per_page` tokens laid out for that group (its KV
layout tag), so a prefix written at TP 2 on devices (0, 1) is found only by that group.

Two tiers (FastSwitch §3.3): a page evicted from the device may move to a host page instead of
being dropped (`evict(..., demote)`); a later match loads it back into a device page (`match(...,
load)`). The caller does the copies (engine/swap.py); the cache only keeps where each page is.

NOTE (invariants):
- Only *full* pages are cached; a page is keyed by (its parent's node id, its tokens): the
  whole prefix up to and including it, matched exactly (dict equality, no hash collisions).
  A first page's parent is `ROOT`, or the request's cache salt (vLLM's `cache_salt`): pages of
  requests with different salts are never shared.
  Node ids are never reused, so an entry whose parent was evicted can no longer be reached.
- A cached page is read-only: a sequence that reuses it starts computing after it, and a
  sequence only ever writes the slots from its `num_computed` on.
- A cached page with no sequence referencing it is *evictable* (least recently used first);
  evicting gives it back to the group's allocator. Pages referenced by a sequence stay.
- An entry is on the device (`page`) or on host (`host`), never both. Host entries are never
  referenced: a match loads them back to the device first. They are evicted in LRU order too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass

ROOT = -1
# A page's parent: a node id, or (first pages) ROOT or the salt of the requests sharing it.
Parent = int | str


def root(salt: str | None) -> Parent:
    """The parent of a request's first page: its cache salt's own root, or ROOT."""
    return ROOT if salt is None else salt


@dataclass
class Entry:
    """One cached page: `node` (unique id), `page` (device page id, None while on host),
    `refs` (sequences using it), `host` (host page id while on host)."""

    node: int
    page: int | None
    key: tuple[Parent, tuple[int, ...]]
    refs: int = 0
    host: int | None = None


class PrefixCache:
    """Full KV pages of one TP group, keyed by the token prefix they end."""

    def __init__(self, tokens_per_page: int) -> None:
        self.tokens_per_page = tokens_per_page
        self.by_key: dict[tuple[Parent, tuple[int, ...]], Entry] = {}
        self.by_page: dict[int, Entry] = {}
        # Entries no sequence uses, least recently used first.
        self.idle: OrderedDict[int, Entry] = OrderedDict()
        # Entries on host, by host page, and least recently used first.
        self.by_host: dict[int, Entry] = {}
        self.host_idle: OrderedDict[int, Entry] = OrderedDict()
        self._next_node = 0
        # Tokens looked up and tokens found (vLLM's prefix_cache_queries / _hits), and of
        # those found, the ones loaded back from host.
        self.queries = 0
        self.hits = 0
        self.host_hits = 0

    def __len__(self) -> int:
        return len(self.by_page)

    @property
    def num_evictable(self) -> int:
        return len(self.idle)

    @property
    def num_host(self) -> int:
        """Host pages the cache holds (all evictable)."""
        return len(self.host_idle)

    def pages(self) -> set[int]:
        """Every page the cache holds."""
        return set(self.by_page)

    def _pages_of(self, tokens: Seq[int]) -> list[tuple[int, ...]]:
        p = self.tokens_per_page
        return [tuple(tokens[i : i + p]) for i in range(0, len(tokens) - p + 1, p)]

    def match(
        self,
        tokens: Seq[int],
        load: Callable[[int], int | None] | None = None,
        salt: str | None = None,
    ) -> list[int]:
        """Pages holding the longest cached prefix of `tokens` that leaves at least one token
        to compute (the step that samples needs it); each gets one more reference.

        A page on host is loaded back with `load(host page)`: it returns the device page the
        caller copies it into (None: no room, the prefix ends there)."""
        self.queries += len(tokens)
        # NOTE: the host entries of this prefix are out of `host_idle` while it loads them:
        # loading one may move a device page to host, and the room for it must not be taken
        # from the ones loaded next.
        chunks = self._pages_of(tokens[: len(tokens) - 1])
        pinned = self._pin_host_chain(chunks, salt) if load is not None and self.host_idle else {}
        got: list[int] = []
        try:
            for e in self._cached(chunks, salt):
                if e.page is None:
                    if load is None or e.host is None:
                        break
                    # NOTE: out of the host maps first, so the evictions `load` may cause
                    # cannot take the page being loaded.
                    host, e.host = e.host, None
                    del self.by_host[host]
                    if pinned.pop(e.node, None) is None:  # moved to host by this very match
                        del self.host_idle[e.node]
                    page = load(host)
                    if page is None:  # back on host, as recently used
                        e.host = host
                        self.by_host[host] = e
                        self.host_idle[e.node] = e
                        break
                    e.page = page
                    self.by_page[page] = e
                    self.host_hits += self.tokens_per_page
                self._ref(e)
                got.append(e.page)
        finally:
            for e in pinned.values():  # not loaded after all: back, as recently used
                self.host_idle[e.node] = e
        self.hits += len(got) * self.tokens_per_page
        return got

    def _cached(self, chunks: list[tuple[int, ...]], salt: str | None) -> Iterator[Entry]:
        """The entries of the cached prefix made of `chunks` (pages' tokens), in order, each
        looked up when the caller asks for it (what the caller did to the one before, such
        as loading it back from host, counts)."""
        parent: Parent = root(salt)
        for chunk in chunks:
            e = self.by_key.get((parent, chunk))
            if e is None:
                return
            yield e
            parent = e.node

    def _pin_host_chain(self, chunks: list[tuple[int, ...]], salt: str | None) -> dict[int, Entry]:
        """Take the host entries of the cached prefix made of `chunks` out of `host_idle`
        (by node, the deepest first, the order they go back in if not loaded)."""
        chain = [e for e in self._cached(chunks, salt) if e.host is not None]
        pinned = {}
        for e in reversed(chain):
            del self.host_idle[e.node]
            pinned[e.node] = e
        return pinned

    def _ref(self, e: Entry) -> None:
        e.refs += 1
        self.idle.pop(e.node, None)

    def release(
        self, pages: list[int], tokens: Seq[int], computed: int, salt: str | None = None
    ) -> list[int]:
        """A sequence lets go of `pages` whose first `computed` tokens of `tokens` hold KV:
        its cached pages lose a reference, its other full computed pages join the cache;
        returns the pages to give back to the allocator (partial ones and duplicates)."""
        free: list[int] = []
        idle: list[Entry] = []
        parent = root(salt)
        full = computed // self.tokens_per_page
        chunks = self._pages_of(tokens[: full * self.tokens_per_page])
        for i, page in enumerate(pages):
            e = self.by_page.get(page)
            if e is not None:  # a cached page this sequence reused
                e.refs -= 1
                if e.refs == 0:
                    idle.append(e)
                parent = e.node
                continue
            if i >= full:
                free.append(page)
                continue
            key = (parent, chunks[i])
            if key in self.by_key:  # the same prefix is cached already: keep one copy
                free.append(page)
                parent = self.by_key[key].node
                continue
            e = Entry(self._next_node, page, key)
            self._next_node += 1
            self.by_key[key] = e
            self.by_page[page] = e
            idle.append(e)
            parent = e.node
        # NOTE: the deepest page becomes idle first, so it is evicted before its parents (an
        # entry whose parent is gone can no longer be matched).
        for e in reversed(idle):
            self.idle[e.node] = e
        return free

    def publish(
        self, pages: list[int], tokens: Seq[int], computed: int, salt: str | None = None
    ) -> int:
        """A running sequence shares its full computed pages (its first `computed` tokens of
        `tokens`) while it still uses them (n > 1 choices forking after one prefill): they
        join the cache referenced once, by it, so later matches share them and its
        `release` only drops that reference. Returns the tokens now matchable."""
        parent = root(salt)
        full = computed // self.tokens_per_page
        chunks = self._pages_of(tokens[: full * self.tokens_per_page])
        for i, page in enumerate(pages[:full]):
            e = self.by_page.get(page)
            if e is None:
                key = (parent, chunks[i])
                if key in self.by_key:  # cached already from another page: that one serves
                    return i * self.tokens_per_page
                e = Entry(self._next_node, page, key, refs=1)
                self._next_node += 1
                self.by_key[key] = e
                self.by_page[page] = e
            parent = e.node
        return full * self.tokens_per_page

    def lru_pages(self, n: int) -> list[int]:
        """The device pages of the `n` least recently used idle entries, in the order
        `evict(n)` takes them."""
        out: list[int] = []
        for e in self.idle.values():
            if len(out) == n:
                break
            assert e.page is not None
            out.append(e.page)
        return out

    def evict(self, n: int, demote: Callable[[int], int | None] | None = None) -> list[int]:
        """Free up to `n` idle device pages, least recently used first; returns their ids.
        With `demote`, an evicted page's entry moves to the host page `demote(page)` returns
        (the caller copies it there; None: dropped)."""
        out: list[int] = []
        while self.idle and len(out) < n:
            _, e = self.idle.popitem(last=False)
            assert e.page is not None
            page, e.page = e.page, None
            del self.by_page[page]
            out.append(page)
            e.host = demote(page) if demote is not None else None
            if e.host is None:
                del self.by_key[e.key]
            else:
                self.by_host[e.host] = e
                self.host_idle[e.node] = e
        return out

    def evict_host(self, n: int) -> list[int]:
        """Drop up to `n` host entries, least recently used first; returns their host pages."""
        out: list[int] = []
        while self.host_idle and len(out) < n:
            _, e = self.host_idle.popitem(last=False)
            assert e.host is not None
            del self.by_key[e.key]
            del self.by_host[e.host]
            out.append(e.host)
        return out

    def clear(self) -> list[int]:
        """Drop every idle device page (the group is going away); returns their page ids.
        NOTE: referenced pages stay until their sequences release them; host entries stay
        until `evict_host`."""
        return self.evict(len(self.idle))
