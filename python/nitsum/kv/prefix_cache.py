"""Prefix reuse: the KV pages of finished (or preempted) sequences stay on the device, keyed
by the tokens they hold, so a later prompt that starts with the same tokens skips that prefill
(a second conversation turn pays only for the new tokens).

One cache per TP group: a page holds `tokens_per_page` tokens laid out for that group (its KV
layout tag), so a prefix written at TP 2 on devices (0, 1) is found only by that group.

NOTE (invariants):
- Only *full* pages are cached; a page is keyed by (its parent's node id, its tokens): the
  whole prefix up to and including it, matched exactly (dict equality, no hash collisions).
  Node ids are never reused, so an entry whose parent was evicted can no longer be reached.
- A cached page is read-only: a sequence that reuses it starts computing after it, and a
  sequence only ever writes the slots from its `num_computed` on.
- A cached page with no sequence referencing it is *evictable* (least recently used first);
  evicting gives it back to the group's allocator. Pages referenced by a sequence stay.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass

ROOT = -1


@dataclass
class Entry:
    """One cached page: `node` (unique id), `page` (page id), `refs` (sequences using it)."""

    node: int
    page: int
    key: tuple[int, tuple[int, ...]]
    refs: int = 0


class PrefixCache:
    """Full KV pages of one TP group, keyed by the token prefix they end."""

    def __init__(self, tokens_per_page: int) -> None:
        self.tokens_per_page = tokens_per_page
        self.by_key: dict[tuple[int, tuple[int, ...]], Entry] = {}
        self.by_page: dict[int, Entry] = {}
        # Entries no sequence uses, least recently used first.
        self.idle: OrderedDict[int, Entry] = OrderedDict()
        self._next_node = 0
        # Tokens looked up and tokens found (vLLM's prefix_cache_queries / _hits).
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self.by_page)

    @property
    def num_evictable(self) -> int:
        return len(self.idle)

    def pages(self) -> set[int]:
        """Every page the cache holds."""
        return set(self.by_page)

    def _pages_of(self, tokens: Seq[int]) -> list[tuple[int, ...]]:
        p = self.tokens_per_page
        return [tuple(tokens[i : i + p]) for i in range(0, len(tokens) - p + 1, p)]

    def match(self, tokens: Seq[int]) -> list[int]:
        """Pages holding the longest cached prefix of `tokens` that leaves at least one token
        to compute (the step that samples needs it); each gets one more reference."""
        self.queries += len(tokens)
        got: list[int] = []
        parent = ROOT
        for chunk in self._pages_of(tokens[: len(tokens) - 1]):
            e = self.by_key.get((parent, chunk))
            if e is None:
                break
            self._ref(e)
            got.append(e.page)
            parent = e.node
        self.hits += len(got) * self.tokens_per_page
        return got

    def _ref(self, e: Entry) -> None:
        e.refs += 1
        self.idle.pop(e.node, None)

    def release(self, pages: list[int], tokens: Seq[int], computed: int) -> list[int]:
        """A sequence lets go of `pages` whose first `computed` tokens of `tokens` hold KV:
        its cached pages lose a reference, its other full computed pages join the cache;
        returns the pages to give back to the allocator (partial ones and duplicates)."""
        free: list[int] = []
        idle: list[Entry] = []
        parent = ROOT
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

    def evict(self, n: int) -> list[int]:
        """Drop up to `n` idle pages, least recently used first; returns their page ids."""
        out: list[int] = []
        while self.idle and len(out) < n:
            _, e = self.idle.popitem(last=False)
            del self.by_key[e.key]
            del self.by_page[e.page]
            out.append(e.page)
        return out

    def clear(self) -> list[int]:
        """Drop every idle page (the group is going away); returns their page ids.
        NOTE: referenced pages stay until their sequences release them."""
        return self.evict(len(self.idle))
