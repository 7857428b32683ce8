"""The KV transport between host worker processes over NIXL: the receiver READs the pages.

Every device registered its KV pages with a NIXL agent (nixl_endpoint.py), and every host
worker process has one more agent for the handoff's control messages; all of them exchanged
their metadata at the rendezvous (kv_rendezvous.py). A handoff, with msgpack notifications
between the host agents:

1. offer (sender A -> receiver B): the request's state (remote_handoff.py `_meta`), where its
   KV is (the prefill group's layout in worker ids, its pages) and how many tokens. A holds
   the sequence, its pages untouched, and streams nothing for it.
2. B allocates pages on the decode group, plans the pieces from A's layout to its own (the
   same `plan_pieces` as a TP switch, so any TP hands off to any TP), and each of its devices
   READs its pieces from A's devices (nixl_descs.py: one descriptor per run of slots, per
   layer, K and V): device to device, no wire tensor, no host copy on either side.
3. took (B -> A) commits it: A frees the pages and forgets the request, B adopts it and
   streams every token, the first one included. refused (B -> A: no room, or a READ failed
   or was late) rolls it back: A decodes it itself, from its pages.

NOTE: no lost request, and the pages are read while A holds them: B gives up on an offer
`timeout_s` after it arrived (a stalled READ is cancelled); A takes it back `2 * timeout_s`
after sending it and then sends withdrawn, which B obeys for offers it has not read yet (an
offer delayed by a dead link arrives with its withdrawal). What is left: an offer delayed
more than `timeout_s` whose READ ends after A's deadline would be decoded on both sides
(A logs it: "taken after it was withdrawn").
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from nitsum.config import ModelConfig
from nitsum.parallel.topology import GroupShape
from nitsum.pool.devices import Devices
from nitsum.pool.migration_plan import Placement, plan_pieces
from nitsum.pool.nixl_agent import Agent
from nitsum.pool.nixl_descs import KVRegion, plan_reads
from nitsum.pool.peers import PeerError

log = logging.getLogger(__name__)


@dataclass
class Offer:
    """A handoff another process offers this one."""

    rank: int
    offer: int  # the sender's number for it
    meta: dict[str, Any]
    src: Placement  # in worker ids
    tokens: int
    arrived: float  # time.monotonic() here


@dataclass
class Inbox:
    """What came since the last poll: offers of ours taken or refused, offers to us."""

    taken: list[int]
    refused: list[tuple[int, str]]
    offers: list[Offer]


class NixlPeers:
    """This process's end of the NIXL KV transport (see the module docstring)."""

    kind = "nixl"

    def __init__(
        self,
        rank: int,
        host: Agent,
        hosts: dict[int, str],
        owner: dict[int, int],
        regions: dict[int, KVRegion],
        pool: Devices,
        first_id: int,
        timeout_s: float = 5.0,
        stall_file: str | None = None,
    ) -> None:
        """`hosts`: rank -> its host agent's name (metadata loaded); `owner`: worker id ->
        rank; `regions`: worker id -> its device's KV region, every process's (metadata
        loaded by this pool's devices); `first_id`: this pool's device 0 as a worker id.
        `stall_file` (tests only): while that file exists, wait the seconds it holds before
        reading an offer's KV, so a test can cut a link mid-transfer."""
        self.rank, self.host, self.hosts, self.owner = rank, host, hosts, owner
        self.rank_of = {name: r for r, name in hosts.items()}
        self.regions, self.pool, self.first_id = regions, pool, first_id
        self.timeout_s = timeout_s
        self.stall_file = stall_file
        self._sent = 0
        self.outgoing: dict[int, tuple[int, float]] = {}  # offer -> (rank, deadline)
        self.withdrawn: set[tuple[int, int]] = set()  # (rank, offer) we must not read
        self.failures = 0  # offers to us that were refused (no room, READ failed or late)
        self.store: object = None  # the rendezvous store, kept as long as this end lives
        log.info("KV transport over NIXL: rank %d, peers serve %s", rank, sorted(owner))

    def serves(self, worker_id: int) -> bool:
        """Whether another process of the transport serves `worker_id`."""
        return self.owner.get(worker_id, self.rank) != self.rank

    def pending(self) -> bool:
        """Offers of ours not settled yet, or notifications not polled yet."""
        return bool(self.outgoing) or self.host.has_notifs()

    # -- the sending side -------------------------------------------------------------------
    def offer(self, worker_id: int, meta: dict[str, Any], src: Placement, tokens: int) -> int:
        """Offer a handoff to the process serving `worker_id`; returns its number.
        PeerError when the offer cannot be sent (nothing was offered)."""
        dst = self.owner[worker_id]
        self._sent += 1
        body = {
            "k": "offer",
            "o": self._sent,
            "meta": meta,
            "src": [list(self._global(src.shape.members)), src.shape.tp, src.shape.pp],
            "pages": list(src.pages),
            "tokens": tokens,
        }
        try:
            self.host.send(self.hosts[dst], msgpack.packb(body))
        except RuntimeError as e:
            raise PeerError(f"KV offer to worker {worker_id} (rank {dst}): {e}") from e
        self.outgoing[self._sent] = (dst, time.monotonic() + 2 * self.timeout_s)
        return self._sent

    def expired(self) -> list[int]:
        """Offers of ours past their deadline: withdrawn (the sender decodes them)."""
        now = time.monotonic()
        out = [o for o, (_, deadline) in self.outgoing.items() if now > deadline]
        for o in out:
            rank, _ = self.outgoing.pop(o)
            self._tell(rank, {"k": "withdrawn", "o": o})
        return out

    def _global(self, members: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self.first_id + m for m in members)

    # -- both sides -------------------------------------------------------------------------
    def poll(self, wait_s: float = 0.0) -> Inbox:
        """The notifications that arrived since the last call, in order (with `wait_s`,
        waiting that long for one when none is there)."""
        inbox = Inbox([], [], [])
        for agent, raw in self.host.notifs(wait_s):
            rank = self.rank_of.get(agent)
            if rank is None:
                log.warning("KV transport: a notification from unknown agent %s", agent)
                continue
            msg = msgpack.unpackb(raw, raw=False)
            match msg["k"]:
                case "offer":
                    members, tp, pp = msg["src"]
                    src = Placement(GroupShape(tuple(members), tp, pp), tuple(msg["pages"]))
                    now = time.monotonic()
                    inbox.offers.append(Offer(rank, msg["o"], msg["meta"], src, msg["tokens"], now))
                case "took" if msg["o"] not in self.outgoing:
                    log.error(
                        "KV offer %d taken after it was withdrawn: the request may stream twice",
                        msg["o"],
                    )
                case "refused" if msg["o"] not in self.outgoing:
                    log.info("KV offer %d refused after it was withdrawn", msg["o"])
                case "took":
                    del self.outgoing[msg["o"]]
                    inbox.taken.append(msg["o"])
                case "refused":
                    del self.outgoing[msg["o"]]
                    inbox.refused.append((msg["o"], msg.get("why", "")))
                case "withdrawn":
                    self.withdrawn.add((rank, msg["o"]))
        return inbox

    # -- the receiving side -----------------------------------------------------------------
    def pull(self, offer: Offer, dst: Placement, cfg: ModelConfig, page_tokens: int) -> int:
        """READ the offer's KV into `dst` (this pool's layout in local device ids, its
        pages allocated); returns the bytes read. PeerError when the offer was withdrawn
        or is too old, TransferFailed (nothing to use) when a READ failed or was late."""
        if self.stall_file and os.path.exists(self.stall_file):
            with open(self.stall_file) as f:
                stall = float(f.read().strip() or 0)
            log.warning(
                "test stall: %.1f s before reading KV of %s", stall, offer.meta["request_id"]
            )
            time.sleep(stall)
        if (offer.rank, offer.offer) in self.withdrawn:
            raise PeerError(f"KV offer {offer.offer} of rank {offer.rank} was withdrawn")
        left = self.timeout_s - (time.monotonic() - offer.arrived)
        if left <= 0:
            raise PeerError(f"KV offer {offer.offer} of rank {offer.rank} is too old to read")
        here = Placement(
            GroupShape(self._global(dst.shape.members), dst.shape.tp, dst.shape.pp), dst.pages
        )
        pieces = plan_pieces(
            cfg.num_kv_heads, cfg.num_layers, page_tokens, offer.tokens, offer.src, here
        )
        reads = plan_reads(pieces, self.regions)
        local = {d - self.first_id: r for d, r in reads.items()}
        return self.pool.nixl_read(local, left)

    def took(self, offer: Offer) -> bool:
        """Commit the offer (its KV is in our pages): the sender lets the request go.
        False when the commit could not be sent (then the sender keeps the request)."""
        return self._tell(offer.rank, {"k": "took", "o": offer.offer})

    def refuse(self, offer: Offer, why: str) -> None:
        """Roll the offer back: the sender decodes the request itself."""
        self.failures += 1
        self._tell(offer.rank, {"k": "refused", "o": offer.offer, "why": why})

    def _tell(self, rank: int, msg: dict[str, Any]) -> bool:
        try:
            self.host.send(self.hosts[rank], msgpack.packb(msg))
        except RuntimeError as e:  # the peer is gone: its deadline settles the offer
            log.warning("KV transport: %s to rank %d not sent: %s", msg["k"], rank, e)
            return False
        return True
