"""Prefill/decode disaggregation across host worker processes.

A request whose decode target is served by another process prefills here; once its prompt is
done and its first token sampled, its KV, tokens and sampler state (handoff_meta.py) go to
that process over the KV transport, which adopts the sequence and streams every token, the
first one included, on the decode target's socket. NOTE: the first token is held back here
and sent with the KV, so the client sees the stream from one process, in order.

Two transports (kv_rendezvous.py chooses):
- NIXL (nixl_peers.py): this process offers the handoff and holds the sequence, pages
  untouched; the receiver READs the pages device to device and commits (took: the pages are
  freed here) or rolls back (refused, or no answer within the deadline: the sequence
  decodes here, its first token streamed now).
- gloo, the fallback (peers.py): the KV is packed into the wire layout (kv_wire.py) and sent
  in full; the sequence leaves once the send is done (a failed send decodes it here), and an
  arrival whose KV does not fit is recomputed from its tokens by the receiver.
A process that dies mid-transfer is the router's to handle (it re-runs the request from the
tokens streamed, docs/protocol.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from nitsum.engine.engine import Engine
from nitsum.engine.request_output import RequestOutput
from nitsum.engine.sequence import Sequence, Status
from nitsum.errors import InvalidRequestError
from nitsum.kv.pages import OutOfPages
from nitsum.parallel.topology import GroupShape
from nitsum.pool.device_pool import DeviceError
from nitsum.pool.handoff_meta import handoff_meta, handoff_sequence
from nitsum.pool.kv_transfer import TransferFailed
from nitsum.pool.kv_wire import export_kv, import_kv
from nitsum.pool.migration_plan import Placement
from nitsum.pool.nixl_peers import NixlPeers, Offer
from nitsum.pool.peers import KVPeers, PeerError
from nitsum.pool.pool_engine import PoolEngine

log = logging.getLogger(__name__)

COUNTERS = (
    "kv_remote_out",  # handoffs that left
    "kv_remote_in",  # handoffs adopted
    "kv_remote_bytes",  # KV bytes of the handoffs that left
    "kv_remote_failed",  # handoffs that did not leave: decoded where prefilled
    "kv_remote_recomputed",  # arrivals without room, prefilled again (gloo)
)


class RemoteHandoffs:
    """The requests of a PoolEngine that decode in another process, and those that came from
    one. `moved()` tells the server which ids left (no final message here) and which arrived
    (and on which worker id they stream)."""

    def __init__(self, pe: PoolEngine, peers: KVPeers | NixlPeers) -> None:
        self.pe = pe
        self.peers = peers
        self.targets: dict[str, int] = {}  # request id -> decode target (a remote worker id)
        self._left: list[str] = []
        self._came: list[tuple[str, int, int]] = []  # (request id, worker id, prompt tokens)
        self.offers: dict[int, tuple[Sequence, Engine]] = {}  # NIXL: offered, not settled
        self.aborted: set[str] = set()  # offered requests the router aborted meanwhile
        self._resumed: list[RequestOutput] = []  # first tokens of offers rolled back
        self.counters = dict.fromkeys(COUNTERS, 0)

    def wants(self, decode_target: int | None) -> bool:
        """Whether `decode_target` is a worker of another process of the transport."""
        return decode_target is not None and self.peers.serves(decode_target)

    def add(self, request_id: str, decode_target: int) -> None:
        self.targets[request_id] = decode_target

    def drop(self, request_id: str) -> None:
        self.targets.pop(request_id, None)
        if any(seq.request_id == request_id for seq, _ in self.offers.values()):
            self.aborted.add(request_id)  # NOTE: its pages may be read now: freed once settled

    def pending(self) -> bool:
        if isinstance(self.peers, NixlPeers):
            return self.peers.pending() or bool(self._resumed)
        return self.peers.pending()

    def moved(self) -> tuple[list[str], list[tuple[str, int, int]]]:
        """(ids handed off, (id, worker id, prompt tokens) adopted) since the last call."""
        left, came = self._left, self._came
        self._left, self._came = [], []
        return left, came

    # -- sending ----------------------------------------------------------------------------
    def ship(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Hand off the requests whose prefill just finished; returns `outputs` without the
        first tokens of those that left (or, over NIXL, were offered)."""
        for out in outputs:
            if out.finished:
                self.targets.pop(out.request_id, None)
        # NOTE: only a first token sampled in this very step is still unsent (held back
        # below); a request that got past it here (its group was lent to a binding at the
        # time) decodes here, or the receiver would stream that token twice.
        fresh = {o.request_id for o in outputs if o.new_token_ids}
        paused = self.pe.binder.paused()
        left: set[str] = set()
        for group, engine in list(self.pe.engines.items()):
            if group in paused:
                continue
            for seq in engine.running():
                target = self.targets.get(seq.request_id)
                if target is None or not seq.movable:
                    continue
                del self.targets[seq.request_id]  # NOTE: one try; a failure decodes here
                first = len(seq.output_ids) == 1 and seq.request_id in fresh
                if first and self._send(seq, engine, target):
                    left.add(seq.request_id)
        return [o for o in outputs if o.request_id not in left]

    def _send(self, seq: Sequence, engine: Engine, target: int) -> bool:
        placement = Placement(seq.layout, tuple(seq.pages))
        log.info(
            "sending KV of %s (%d tokens) to worker %d", seq.request_id, seq.num_computed, target
        )
        if isinstance(self.peers, NixlPeers) and set(seq.layout.members) & self.pe.solo:
            # NOTE: a device restarted alone has no NIXL agent, and peers hold its old one.
            log.info("%s decodes here: its group has a device restarted alone", seq.request_id)
            return False
        try:
            if isinstance(self.peers, NixlPeers):
                offer = self.peers.offer(
                    target, handoff_meta(seq, target), placement, seq.num_computed
                )
                engine.detach(seq, free=False)  # NOTE: the receiver reads its pages now
                self.offers[offer] = (seq, engine)
                return True
            cfg, page_tokens = self.pe.cfg, self.pe.ecfg.page_tokens
            kv = export_kv(self.pe.pool, cfg, page_tokens, seq.num_computed, placement)
            sent = self.peers.send(target, handoff_meta(seq, target), kv)
        except PeerError as e:
            log.warning("%s; %s decodes here", e, seq.request_id)
            self.counters["kv_remote_failed"] += 1
            return False
        engine.detach(seq)
        self._gone(seq.request_id, sent)
        return True

    def _gone(self, request_id: str, nbytes: int) -> None:
        self._left.append(request_id)
        self.counters["kv_remote_out"] += 1
        self.counters["kv_remote_bytes"] += nbytes

    def settle(self) -> list[Offer]:
        """NIXL: let the offers taken go, take back those refused or past their deadline;
        returns the offers to this process that came meanwhile."""
        assert isinstance(self.peers, NixlPeers)
        # NOTE: with nothing to step but offers to settle, wait for news a little instead of
        # spinning the serving loop at full speed until they settle (up to their deadline).
        idle = self.offers and not self.pe.has_unfinished() and not self._resumed
        inbox = self.peers.poll(wait_s=0.002 if idle else 0.0)
        for o in inbox.taken:
            seq, engine = self.offers.pop(o)
            engine.free_pages(seq)
            self.aborted.discard(seq.request_id)
            self._gone(seq.request_id, seq.num_computed * self._token_bytes())
        back = [(o, why) for o, why in inbox.refused]
        back += [(o, "no answer in time") for o in self.peers.expired()]
        for o, why in back:
            seq, engine = self.offers.pop(o)
            if seq.request_id in self.aborted:
                self.aborted.discard(seq.request_id)
                engine.free_pages(seq)
                continue
            log.warning("KV handoff of %s rolled back (%s); it decodes here", seq.request_id, why)
            self.counters["kv_remote_failed"] += 1
            engine.adopt(seq)
            self._resumed.append(RequestOutput(seq.request_id, list(seq.output_ids), None))
        return inbox.offers

    def settle_all(self) -> None:
        """NIXL: wait until no offer of ours is in flight (before the groups change; at most
        the offers' deadline). Offers to this process meanwhile are refused."""
        while isinstance(self.peers, NixlPeers) and self.offers:
            for offer in self.settle():
                self.peers.refuse(offer, "its decode process is changing its groups")
            time.sleep(0.005)

    def _token_bytes(self) -> int:
        cfg = self.pe.cfg
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * self.pe.ecfg.dtype.itemsize

    # -- receiving --------------------------------------------------------------------------
    def receive(self, group_of: dict[int, GroupShape]) -> list[RequestOutput]:
        """Adopt the handoffs that arrived, each on the group holding its decode target
        (`group_of`: worker id -> group); returns their first tokens to stream (and, over
        NIXL, those of our offers rolled back)."""
        if isinstance(self.peers, NixlPeers):
            offers = self.settle()
            outputs, self._resumed = self._resumed, []
            return outputs + self._adopt_offers(offers, group_of)
        outputs = []
        for meta, kv in self.peers.arrivals():
            if self._runs(meta["request_id"]):
                log.error("dropped a handoff of %s: it already runs here", meta["request_id"])
                continue
            target = int(meta["target"])
            try:
                seq = self._adopt(meta, kv, group_of[target])
            except (InvalidRequestError, ValueError) as e:
                # NOTE: its sender let it go: end it with the error rather than lose it.
                log.error("handoff of %s refused: %s", meta["request_id"], e)
                outputs.append(RequestOutput(meta["request_id"], [], "error", str(e)))
                continue
            outputs.append(self._came_here(seq, target))
        return outputs

    def _runs(self, request_id: str) -> bool:
        return any(request_id in e.request_ids() for _, e in self.pe.every_engine())

    def _came_here(self, seq: Sequence, target: int) -> RequestOutput:
        self._came.append((seq.request_id, target, len(seq.prompt_ids)))
        self.counters["kv_remote_in"] += 1
        return RequestOutput(seq.request_id, list(seq.output_ids), None)

    def _adopt_offers(
        self, offers: list[Offer], group_of: dict[int, GroupShape]
    ) -> list[RequestOutput]:
        """NIXL: READ each offer's KV into pages of its target's group, then commit it; an
        offer that cannot be taken is refused (its sender decodes it)."""
        assert isinstance(self.peers, NixlPeers)
        outputs = []
        for offer in offers:
            rid = offer.meta["request_id"]
            group = group_of.get(int(offer.meta["target"]))
            if group is None or self._runs(rid):
                self.peers.refuse(offer, "no group to adopt it" if group is None else "runs here")
                continue
            engine = self.pe.engines[group]
            if (
                set(group.members) & self.pe.solo
            ):  # NOTE: restarted alone: no NIXL agent to READ with
                self.peers.refuse(offer, "its decode group has a device restarted alone")
                continue
            try:
                seq = handoff_sequence(offer.meta)
                need = engine.pages.pages_for(seq.num_computed)
                engine.reclaim(need)  # NOTE: idle cached pages give way to arriving KV
                seq.pages = engine.pages.allocate(need)
            except (InvalidRequestError, ValueError, OutOfPages) as e:
                self.peers.refuse(offer, f"{type(e).__name__}: {e}")
                continue
            try:
                dst = Placement(engine.shape, tuple(seq.pages))
                log.info("reading KV of %s (%d tokens)", rid, offer.tokens)
                self.peers.pull(offer, dst, self.pe.cfg, self.pe.ecfg.page_tokens)
            except (PeerError, TransferFailed, DeviceError) as e:
                log.warning("handoff of %s dropped, its sender decodes it: %s", rid, e)
                engine.pages.release(seq.pages)
                self.peers.refuse(offer, str(e))
                continue
            if not self.peers.took(offer):
                engine.pages.release(seq.pages)
                continue
            seq.layout = engine.shape
            engine.adopt(seq)
            outputs.append(self._came_here(seq, int(offer.meta["target"])))
        return outputs

    def _adopt(self, meta: dict[str, Any], kv: torch.Tensor, group: GroupShape) -> Sequence:
        engine = self.pe.engines[group]
        seq = handoff_sequence(meta)
        pages = engine.pages
        need = pages.pages_for(seq.num_computed)
        engine.reclaim(need)  # NOTE: idle cached pages give way to arriving KV
        try:
            seq.pages = pages.allocate(need)
            placement = Placement(engine.shape, tuple(seq.pages))
            import_kv(self.pe.pool, self.pe.cfg, self.pe.ecfg.page_tokens, kv, placement)
        except (OutOfPages, RuntimeError) as e:  # no room, or a device failed: recompute
            log.warning("handoff of %s recomputes: %s", seq.request_id, e)
            if seq.pages:
                pages.release(seq.pages)
            seq.pages, seq.num_computed, seq.status = [], 0, Status.WAITING
            self.counters["kv_remote_recomputed"] += 1
        seq.layout = engine.shape
        engine.adopt(seq)
        return seq
