"""One device id's connection to one router: a DEALER socket, its monitor, register/heartbeat,
and whether the peer at the router's address has proven the worker secret on it.

A host worker owns one link per device it serves and router it serves them to (several routers
in front of one pool: every worker registers with every router), so each router sees one
worker per device (docs/protocol.md). The link knows nothing about engines: the server builds
the messages.
"""

from __future__ import annotations

import logging
import secrets
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from nitsum.worker import handshake
from nitsum.worker import protocol as proto
from nitsum.worker.codec import Message, encode

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20  # a larger message drops the connection (docs/security.md)
MAX_HELD_BYTES = 64 << 20  # frames held while the router has not proven itself yet

LinkKey = tuple[int, int]
"""A link's key: (the router's index in the worker's `--router` list, the device id)."""


class RouterLink:
    """The DEALER socket of worker `worker_id`.

    NOTE: its ZMQ identity is random (`w<id>-<32 hex>`), fixed for the socket's life so that
    reconnects keep it: the router routes by identity, and a guessable one would let another
    peer that connects with it take over this worker's routing slot (docs/security.md).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        worker_id: int,
        router_addr: str,
        register_every_s: float,
        heartbeat_every_s: float,
        authenticate: bool = False,
        router: int = 0,
    ) -> None:
        """`authenticate`: the worker has a secret, so the router must prove it (handshake.py)
        before anything it sends is acted on; without one every peer counts as proven.
        `router`: the router's index in the worker's list of routers."""
        self.worker_id = worker_id
        self.router = router
        self.router_addr = router_addr
        self.authenticate = authenticate
        # NOTE (invariant): with `authenticate`, `proven` is True only after the peer on this
        # connection answered our latest `hello` with a valid proof; it drops with the
        # connection. Until then frames are held (bounded), not handled.
        self.proven = not authenticate
        self.hello_nonce: str | None = None  # our nonce of the handshake in progress
        self.held: list[bytes] = []
        self._held_bytes = 0
        self.register_every_s = register_every_s
        self.heartbeat_every_s = heartbeat_every_s
        self.registered = False
        self._lost = False  # the connection dropped and has not come back yet
        self.sock = ctx.socket(zmq.DEALER)
        self.identity = f"w{worker_id}-{secrets.token_hex(16)}".encode()
        self.sock.setsockopt(zmq.IDENTITY, self.identity)
        self.sock.setsockopt(zmq.LINGER, 1000)  # flush the last tokens on exit, but never hang
        # Bound what a peer at the router's address can make us buffer (the router does too).
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(router_addr)
        now = time.monotonic()
        self.next_register = self.next_heartbeat = now

    @property
    def key(self) -> LinkKey:
        """(router index, device id)."""
        return self.router, self.worker_id

    def due(self, now: float) -> tuple[bool, bool]:
        """(register due, heartbeat due) at `now`; advances the timers of what is due."""
        register = not self.registered and now >= self.next_register
        if register:
            self.next_register = now + self.register_every_s
        return register, self.heartbeat_due(now)

    def heartbeat_due(self, now: float) -> bool:
        """Whether a heartbeat is due at `now`; advances its timer if so."""
        if now < self.next_heartbeat:
            return False
        self.next_heartbeat = now + self.heartbeat_every_s
        return True

    def on_monitor(self) -> bool:
        """Track the connection; when it comes back (a restarted router), re-register now.
        Returns whether it was lost just now (the server drops what that router sent)."""
        event = recv_monitor_message(self.monitor)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            log.warning(
                "worker %d lost the router at %s; will re-register",
                self.worker_id,
                self.router_addr,
            )
            self.registered = False
            self.proven = not self.authenticate  # whoever answers next must prove it again
            self._lost = True
            return True
        if event == zmq.EVENT_CONNECTED and self._lost:
            self._lost = False
            self.next_register = time.monotonic()
        # The first connect needs nothing: the register queued before it goes out by itself.
        return False

    def hello(self) -> proto.Hello:
        """Open a handshake: `hello` with a fresh nonce; the peer must answer it with a valid
        proof before anything it sends is handled."""
        self.hello_nonce = handshake.new_nonce()
        self.proven = not self.authenticate
        return proto.Hello(self.worker_id, handshake.HANDSHAKE_VERSION, self.hello_nonce)

    def hold(self, frame: bytes) -> None:
        """Keep a frame from a peer that has not proven itself yet (handled if it does)."""
        if self._held_bytes + len(frame) > MAX_HELD_BYTES:
            log.warning("worker %d dropped a frame from an unproven router", self.worker_id)
            return
        self.held.append(frame)
        self._held_bytes += len(frame)

    def answer(self, secret: bytes, msg: proto.Challenge, model: str) -> str | None:
        """End the handshake in progress on `msg`: our `register.auth` when the peer proved
        the secret for our `hello` (then `take_held` has what it sent meanwhile), else None
        (the held frames are dropped, the next `hello` goes out on the register timer)."""
        ours, self.hello_nonce = self.hello_nonce, None
        self.proven = (
            ours is not None
            and msg.handshake == handshake.HANDSHAKE_VERSION
            and msg.worker_id == self.worker_id
            and handshake.router_proven(secret, ours, msg.nonce, self.worker_id, msg.proof)
        )
        if ours is None or not self.proven:
            self.take_held()
            return None
        return handshake.worker_proof(secret, ours, msg.nonce, self.worker_id, model)

    def take_held(self) -> list[bytes]:
        """The frames held while the handshake was in progress, removed."""
        held, self.held, self._held_bytes = self.held, [], 0
        return held

    def recv_all(self) -> list[bytes]:
        """Every frame waiting on the socket, without blocking."""
        frames = []
        while True:
            try:
                frames.append(self.sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                return frames

    def send(self, msg: Message) -> None:
        try:
            # NOTE: never block: with the router gone for long, the queue fills (SNDHWM) and a
            # blocking send would hang the loop, deaf to `stop()` and to signals.
            self.sock.send(encode(msg.to_wire()), zmq.NOBLOCK)
        except zmq.Again:
            log.warning("router not reachable: worker %d dropped a %s", self.worker_id, msg.TYPE)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close()
