"""The worker server: one DEALER socket per served device id and router, around one backend.

A single-device worker is the N=1 case of a host worker (both a `PoolBackend`: a PoolEngine
over one in-process device or N device processes): towards the router both look like one
worker per device id (docs/protocol.md). With several routers in front of one pool every
device registers with every router; each request's tokens go back to the router that sent it,
and the plan comes from whichever leads (docs/protocol.md "Several routers").

One thread does everything: poll the sockets, handle messages, run `backend.step()` while
there is work, stream `tokens`, and send `register` / `heartbeat` on each link's timers; only
while a step runs does a second thread (`heartbeat.py`) send the heartbeats, so that a long
step is not silence. Messages are handled between steps, so a `reconfigure` is always applied
at an iteration boundary. See docs/serving.md for how it is launched.

The server is the loop that wires its parts: each device id's registration and device loss
(`registration.py`), the plan it follows (`active_plan.py`) and the requests' token streams
(`outputs.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import zmq

from nitsum.errors import InvalidRequestError
from nitsum.worker import inbound
from nitsum.worker import protocol as proto
from nitsum.worker.active_plan import ActivePlan
from nitsum.worker.assignment import Assignment
from nitsum.worker.backend import Backend
from nitsum.worker.channel import ChannelError
from nitsum.worker.heartbeat import StepHeartbeats
from nitsum.worker.link import LinkKey, RouterLink
from nitsum.worker.outputs import TokenStreams
from nitsum.worker.protocol import Message, ProtocolError
from nitsum.worker.registration import Registration
from nitsum.worker.stats import Stats

log = logging.getLogger(__name__)


class WorkerServer:
    """Serves `backend` to the router at `router_addr`, as one worker per device id.

    NOTE: every accepted `generate` ends in exactly one `tokens` message with a finish reason,
    sent on the socket the `generate` arrived on (also after a TP switch moved the request to
    another group): `self.live` holds the accepted ids, and `TokenStreams.final` (outputs.py)
    is the only place that removes one.
    """

    def __init__(
        self,
        backend: Backend,
        router_addr: str | list[str],
        model_name: str,
        device: str = "cpu",
        register_every_s: float = 5.0,
        heartbeat_every_s: float = 0.5,
        idle_poll_ms: int = 50,
        context: zmq.Context | None = None,
        secret: bytes | None = None,
        kv_transport: str | None = None,
    ) -> None:
        """`router_addr`: the router's worker address, or every router's (several routers in
        front of one pool). `secret`: the shared worker secret that answers the router's
        `challenge` (docs/security.md); without it only a router with authentication off
        accepts us. `kv_transport`: the KV transport's rendezvous address, when the backend
        joined one (sent in `register`: the router may then hand this process's KV to
        others)."""
        self.backend = backend
        self.router_addrs = [router_addr] if isinstance(router_addr, str) else list(router_addr)
        self.register_every_s = register_every_s
        self.heartbeat_every_s = heartbeat_every_s
        self.idle_poll_ms = idle_poll_ms
        self.secret = secret
        self.ctx = context or zmq.Context.instance()
        self.links: dict[LinkKey, RouterLink] = {}
        self.plan = ActivePlan(backend)
        self.streams = TokenStreams(backend, self.links)
        self.live = self.streams.live  # request id -> ((router, device) it came on, prompt)
        self.registration = Registration(
            backend,
            self.links,
            self.live,
            self.plan,
            model_name,
            device,
            len(self.router_addrs) > 1,
            register_every_s,
            secret,
            kv_transport,
        )
        self.down = self.registration.down  # device ids whose process died, until restarted
        self._stop = threading.Event()
        self.heartbeats = StepHeartbeats(self.links, heartbeat_every_s)

    @property
    def assignment(self) -> Assignment:
        """The first device's assignment (the whole story for a single-device worker)."""
        return self.plan.assignments[self.backend.device_ids[0]]

    @property
    def registered(self) -> bool:
        """Whether every router has acknowledged every device's `register`."""
        return bool(self.links) and all(link.registered for link in self.links.values())

    def stop(self) -> None:
        """Ask the loop to exit (thread-safe); `run` returns within one poll interval."""
        self._stop.set()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until `shutdown` or `stop()`; closes the sockets on the way out."""
        poller = zmq.Poller()
        owners: dict[zmq.Socket, tuple[RouterLink, bool]] = {}  # socket -> (link, is monitor)
        for r, addr in enumerate(self.router_addrs):
            for d in self.backend.device_ids:
                link = RouterLink(
                    self.ctx,
                    d,
                    addr,
                    self.register_every_s,
                    self.heartbeat_every_s,
                    authenticate=self.secret is not None,
                    router=r,
                )
                self.links[link.key] = link
                for sock, is_monitor in ((link.sock, False), (link.monitor, True)):
                    poller.register(sock, zmq.POLLIN)
                    owners[sock] = (link, is_monitor)
        log.info("worker %s connecting to %s", self.backend.device_ids, self.router_addrs)
        self.heartbeats = StepHeartbeats(self.links, self.heartbeat_every_s)
        self.heartbeats.start()
        next_stats = time.monotonic()
        try:
            while not self._stop.is_set():
                self.registration.watch_devices()
                now = time.monotonic()
                stats_due = now >= next_stats
                if stats_due:
                    next_stats = now + self.heartbeat_every_s
                for (_, d), link in self.links.items():
                    if d in self.down:
                        # NOTE: the step thread must not keep a dead device alive either.
                        self.heartbeats.latest.pop(d, None)
                        continue
                    register, heartbeat = link.due(now)
                    if register:
                        link.send(self.registration.opening_msg(link))
                    stale = link.key in self.heartbeats.stale  # the step thread resent an old load
                    self.heartbeats.stale.discard(link.key)
                    # NOTE: nothing but the handshake goes to a router that has not accepted us.
                    if (heartbeat or stale) and link.registered:
                        beat = self._heartbeat_msg(d)
                        self.heartbeats.latest[d] = beat
                        link.send(beat)
                    # One report per backend and router (on its first device's link): the
                    # counters cover all its devices. NOTE: on a timer of its own, not with the
                    # heartbeat: while steps run the heartbeat thread sends most heartbeats.
                    if d == self.backend.device_ids[0] and link.registered and stats_due:
                        counters, last_bind = self.backend.counters(), self.backend.last_bind()
                        if counters or last_bind is not None:
                            link.send(Stats.of(d, counters, last_bind))
                busy = self.backend.has_unfinished()
                events = poller.poll(0 if busy else self.idle_poll_ms)
                # Connection events first: a frame from a new peer is never taken for the old's.
                for sock, _ in sorted(events, key=lambda e: not owners[e[0]][1]):
                    link, is_monitor = owners[sock]
                    if is_monitor:
                        if link.on_monitor():
                            self.registration.drop_orphans(link.key)
                        continue
                    for frame in link.recv_all():
                        self._handle(link.key, frame)
                if self.backend.has_unfinished() and not self._stop.is_set():
                    self._step()
                    # NOTE: a device that died in the step: report it now.
                    self.registration.watch_devices()
            self.streams.fail_all("worker shut down")
        finally:
            self.heartbeats.close()
            for link in self.links.values():
                link.close()
            self.links.clear()
            log.info("worker %s stopped", self.backend.device_ids)

    def _handle(self, key: LinkKey, frame: bytes) -> None:
        try:
            try:
                plain = self.links[key].receive(frame)
            except ChannelError as e:
                self.registration.on_channel_failed(key, str(e))
                return
            if plain is None:
                return
            msg = proto.decode(plain)
            if msg["type"] == "generate":
                self._on_generate(key, msg)
                return
            if msg["type"] == "reconfigure":  # answered even when it does not parse
                self._on_reconfigure(key, msg)
                return
            kind = proto.ROUTER_MESSAGES.get(msg["type"])
            if kind is None:
                log.warning("dropped message of unknown type %r", msg["type"])
                return
            self._dispatch(key, kind.from_wire(msg))
        except ProtocolError as e:
            log.error("dropped message: %s", e)
        except Exception:  # a bug in one handler must not take the worker down
            log.exception("failed to handle a message")

    def _dispatch(self, key: LinkKey, msg: Message) -> None:
        match msg:
            case proto.Challenge():
                self.registration.on_challenge(key, msg)
            case proto.Refused():
                log.error(
                    "router %s refused worker %d: %s",
                    self.links[key].router_addr,
                    key[1],
                    msg.error,
                )
            case proto.Registered():
                self.registration.on_registered(key, msg)
            case proto.Reregister():
                self.registration.on_reregister(key)
            case proto.Abort():
                self._on_abort(msg.request_id)
            case proto.FlushCache():
                freed = self.backend.flush_prefix_cache()
                log.info("flushed the prefix caches: %d device pages freed", freed)
            case proto.Shutdown():
                self._stop.set()

    # -- messages ---------------------------------------------------------------------------------
    def _heartbeat_msg(self, device: int) -> proto.Heartbeat:
        running, waiting, free_pages = self.backend.load(device)
        return proto.Heartbeat(device, running, waiting, free_pages, self.plan.epoch)

    def _on_generate(self, key: LinkKey, msg: dict[str, Any]) -> None:
        device = key[1]
        rid = inbound.request_id_of(msg)
        if device in self.down:
            # Sent before the router read our `device_lost`: it resumes this request too.
            log.warning("dropped generate for %r on lost device %d", rid, device)
            return
        if rid in self.live:
            # Answering would end the running request's stream twice; the router owns ids.
            log.error("dropped generate for %r: that request is already running", rid)
            return
        ids = msg.get("input_ids")
        self.live[rid] = (key, len(ids) if isinstance(ids, list) else 0)
        try:
            self.backend.add(device, inbound.parse_generate(msg))
        except InvalidRequestError as e:
            self.streams.final(rid, [], "error", str(e), error_param=e.field)
        except proto.ProtocolError as e:  # a malformed message: the codec names the field
            self.streams.final(rid, [], "error", str(e), error_param=e.field)
        except Exception as e:  # a bug must cost one request, not the worker
            log.exception("add(%r) failed", rid)
            self.streams.final(rid, [], "error", f"internal error: {type(e).__name__}: {e}")

    def _on_abort(self, rid: str) -> None:
        if rid not in self.live:
            return  # unknown or already finished: races with completion are normal
        self.backend.abort(rid)
        self.streams.final(rid, [], "abort", None)

    def _on_reconfigure(self, key: LinkKey, msg: dict[str, Any]) -> None:
        """Apply a plan once per epoch and answer every copy (active_plan.py).

        NOTE: with several routers only the leader sends plans; one older than the active plan
        (a deposed leader's) is refused there, whichever router it came from."""
        # NOTE: a switch may take seconds (a KV migration; KV offers to another host settling
        # first, up to their deadline): the heartbeats go on meanwhile, as during a step.
        with self.heartbeats.stepping():
            answer = self.plan.answer(key[1], msg)
        self.links[key].send(answer)

    # -- engine -----------------------------------------------------------------------------------
    def _step(self) -> None:
        try:
            with self.heartbeats.stepping():
                outputs = self.backend.step()
        except Exception as e:
            log.exception("engine step failed")
            # The sequences of the failed batch are the running ones; if none is running the
            # failure came before admission, so fail everyone rather than loop on it forever.
            for rid in self.backend.running() or self.backend.requests():
                self.streams.fail(rid, f"engine step failed: {type(e).__name__}: {e}")
            return
        self.streams.deliver(outputs)
