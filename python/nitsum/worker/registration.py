"""Each served device id's standing with each router: registration, and device loss.

A device id registers over its link to each router (worker/link.py; several routers in front
of one pool: with every one of them): with a secret, `hello` first and
`register` only once the router proved the secret in its `challenge` (docs/protocol.md
"Handshake"); without one, a plain `register`. The router may ask a device to register
again (`reregister`); a device whose process died is reported (`device_lost`) and, once
restarted, registers again (worker/device_watch.py).

NOTE: a router that admits a device (again) holds none of the requests that came on it
before, so those are aborted here without an answer: the router resumes or ended them. The
same goes for what a router sent when its connection drops (it died, or it will see us
register again): only that router's requests, those on that link.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from nitsum.worker import handshake
from nitsum.worker import protocol as proto
from nitsum.worker.active_plan import ActivePlan
from nitsum.worker.backend import Backend
from nitsum.worker.link import LinkKey, RouterLink
from nitsum.worker.protocol import Message

log = logging.getLogger(__name__)


@dataclass
class Registration:
    """The registration of every device id `backend` serves, on `links` (one per router and
    device).

    `live`: the server's accepted requests (request id -> ((router, device) it came on,
    prompt)); `plan`: the plan followed, whose epoch the router's `registered` sets (with
    `several_routers`, only raises: a follower's epoch lags the leader's); the rest is what
    `register` says and the handshake's settings (worker/server.py).
    """

    backend: Backend
    links: dict[LinkKey, RouterLink]  # NOTE: the server's dict, filled when it connects
    live: dict[str, tuple[LinkKey, int]]
    plan: ActivePlan
    model_name: str
    device: str
    several_routers: bool
    register_every_s: float
    secret: bytes | None
    kv_transport: str | None
    # Device ids whose process died, until restarted: no register, no heartbeat.
    down: set[int] = field(default_factory=set)

    # -- the handshake ----------------------------------------------------------------------------
    def opening_msg(self, link: RouterLink) -> Message:
        """What opens a registration: `hello` when we have a secret (the router must prove it
        first, docs/protocol.md "Handshake"), else a plain `register`."""
        return self.register_msg(link.worker_id) if self.secret is None else link.hello()

    def register_msg(self, device: int, auth: str | None = None) -> proto.Register:
        """`register` for `device`, with the worker's proof `auth` after a handshake."""
        kv_tokens, max_context, eos = self.backend.capacity()
        tp_levels, domain = self.backend.register_shape(device)
        return proto.Register(
            device,
            self.device,
            self.model_name,
            tp_levels,
            domain,
            kv_tokens,
            max_context,
            list(eos),
            auth=auth,
            kv_transport=self.kv_transport,
        )

    def links_of(self, device: int) -> list[RouterLink]:
        """`device`'s link to every router."""
        return [link for (_, d), link in self.links.items() if d == device]

    def on_challenge(self, key: LinkKey, msg: proto.Challenge) -> None:
        """Check the router's proof of the secret; only then prove ours in `register`, after
        which every frame is sealed (docs/protocol.md "Handshake")."""
        if self.secret is None:
            log.error(
                "the router requires worker authentication: set %s for worker %d",
                proto.SECRET_ENV,
                key[1],
            )
            return
        link = self.links[key]
        if msg.handshake != handshake.HANDSHAKE_VERSION:
            log.error(
                "the router at %s speaks handshake version %s; worker %d needs %d (every frame "
                "after it sealed): upgrade the router. Sent it nothing",
                link.router_addr,
                msg.handshake,
                key[1],
                handshake.HANDSHAKE_VERSION,
            )
        auth = link.answer(self.secret, msg, self.model_name)
        if auth is None:
            log.error(
                "the peer at %s did not prove the worker secret to worker %d (a wrong secret, "
                "an old router, or not the router at all): sent it nothing; retrying in %.0f s",
                link.router_addr,
                key[1],
                self.register_every_s,
            )
            return
        link.send_register(self.secret, self.register_msg(key[1], auth))

    # -- the router's answers ---------------------------------------------------------------------
    def on_registered(self, key: LinkKey, msg: proto.Registered) -> None:
        link = self.links[key]
        if self.several_routers:
            # NOTE: only the leader's `reconfigure` moves the epoch forward; a follower's
            # `registered` carries the last plan it took, so it may only lag (never lower ours:
            # an older epoch must stay refused, docs/protocol.md "Several routers").
            self.plan.epoch = max(self.plan.epoch, msg.epoch)
        else:
            self.plan.epoch = msg.epoch
        if not link.registered:
            log.info(
                "worker %d registered with %s (epoch %d)",
                key[1],
                link.router_addr,
                self.plan.epoch,
            )
            if not self.several_routers:
                # Maybe a restarted router, whose epochs may repeat the old one's: forget the
                # answers kept for the old router's plans. (Several routers' leaders number
                # their epochs by their lease terms: none repeats.)
                self.plan.acks.clear()
            self.drop_orphans(key)
        link.registered = True

    def drop_orphans(self, key: LinkKey) -> None:
        """Abort what arrived on link `key` (that router, that device) before this
        registration or before its connection dropped, without answering.

        NOTE: a router that admits a worker (again) holds none of its earlier requests (a
        restarted router never knew them; a live one resumes them elsewhere, state/orphans.rs),
        and a router whose connection dropped will admit it again or is gone: running them on
        would only hold KV pages nobody reads. Other routers' requests run on."""
        orphans = [rid for rid, (arrived_on, _) in self.live.items() if arrived_on == key]
        for rid in orphans:
            self.backend.abort(rid)
            del self.live[rid]
        if orphans:
            log.warning(
                "worker %d aborted %d requests of a lost router (%s)",
                key[1],
                len(orphans),
                self.links[key].router_addr,
            )

    def on_reregister(self, key: LinkKey) -> None:
        """The router declared this device dead (e.g. a step outlasted the heartbeat timeout)
        and already ended its requests: drop them here too and register again at once.
        NOTE: while our `hello` waits for its challenge this is a no-op (the router asks once
        per frame it could not open; the handshake under way answers them all)."""
        if self.links[key].handshaking:
            return
        self._drop_link_requests(key)
        link = self.links[key]
        log.warning("router %s asked worker %d to register again", link.router_addr, key[1])
        link.registered = False
        link.next_register = time.monotonic()

    def on_channel_failed(self, key: LinkKey, why: str) -> None:
        """A frame from the router did not open on the channel (forged, modified, replayed,
        reordered, or one was dropped on the way): end the channel, drop what came on it
        (the router resumes those requests elsewhere once we authenticate again) and open a
        new handshake at once."""
        link = self.links[key]
        log.error(
            "worker %d: a frame from %s failed to open (%s): tampering on the network path? "
            "Ending the channel and authenticating again",
            key[1],
            link.router_addr,
            why,
        )
        link.end_channel()
        self._drop_link_requests(key)
        link.registered = False
        link.next_register = time.monotonic()

    def _drop_link_requests(self, key: LinkKey) -> None:
        for rid, (arrived_on, _) in list(self.live.items()):
            if arrived_on == key:
                self.backend.abort(rid)
                del self.live[rid]

    # -- device loss ------------------------------------------------------------------------------
    def watch_devices(self) -> None:
        """Report dead devices to the router at once (`device_lost`: it resumes their
        requests elsewhere) and register restarted ones again (worker/device_watch.py)."""
        events = self.backend.device_events()
        for lost in events.lost:
            d = lost.device
            self.down.add(d)
            mates: set[int] = set()
            for rid in lost.request_ids:  # dropped by the engines: no final from here
                arrived_on, _ = self.live.pop(rid, ((0, d), 0))
                mates.add(arrived_on[1])
            # NOTE: the routers resume every request that came on `d`, wherever it runs now.
            for rid in [r for r, (on, _) in self.live.items() if on[1] == d]:
                self.backend.abort(rid)
                del self.live[rid]
            for link in self.links_of(d):
                link.registered = False
                link.send(proto.DeviceLost(d, lost.reason))  # NOTE: after its last `tokens`
            # Members of a TP group with `d` that live on: their requests were dropped too;
            # registering again is how each router learns to resume them (`reregister`).
            for mate in sorted(mates - self.down):
                for link in self.links_of(mate):
                    self.on_reregister(link.key)
        for d in events.back:
            self.down.discard(d)
            for link in self.links_of(d):
                link.next_register = time.monotonic()
