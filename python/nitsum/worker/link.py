"""One device id's connection to one router: a DEALER socket, its monitor, register/heartbeat,
and, with a worker secret, the handshake in progress and the sealed channel it ends in
(channel.py): after it, nothing crosses in clear.

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

from nitsum.codec import Message, ProtocolError, decode, encode
from nitsum.worker import handshake
from nitsum.worker import protocol as proto
from nitsum.worker.channel import Channel, ChannelKeys, is_sealed, transcript_hash

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20  # a larger message drops the connection (docs/security.md)
# What the router may send in clear on an authenticating link (the handshake's own messages).
CLEAR_FROM_ROUTER = ("challenge", "refused", "reregister")

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
        and every frame after the handshake is sealed (channel.py); without one frames are clear.
        `router`: the router's index in the worker's list of routers."""
        self.worker_id = worker_id
        self.router = router
        self.router_addr = router_addr
        self.authenticate = authenticate
        # NOTE (invariant): with `authenticate`, `channel` is set only from our `register` that
        # answered a challenge proving the secret for our latest `hello`, until the next `hello`
        # or a frame that fails to open; nothing but the handshake is sent or handled without it.
        self.channel: Channel | None = None
        self.hello_nonce: str | None = None  # our nonce of the handshake in progress
        self._hello_frame = b""  # the exact frames of the handshake in progress
        self._challenge_frame = b""
        self._nonces = (b"", b"")  # (worker, router) of the handshake answered last
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
            # NOTE: the channel survives a reconnect (the router keeps it for this identity);
            # a restarted router asks us to authenticate again (`reregister`).
            self._lost = True
            return True
        if event == zmq.EVENT_CONNECTED and self._lost:
            self._lost = False
            self.next_register = time.monotonic()
        # The first connect needs nothing: the register queued before it goes out by itself.
        return False

    @property
    def handshaking(self) -> bool:
        """Whether our `hello` waits for its challenge."""
        return self.hello_nonce is not None

    def hello(self) -> proto.Hello:
        """Open a handshake: `hello` with a fresh nonce; it ends the channel (a new one comes
        from this handshake)."""
        self.hello_nonce = handshake.new_nonce()
        self.channel = None
        return proto.Hello(self.worker_id, handshake.HANDSHAKE_VERSION, self.hello_nonce)

    def receive(self, frame: bytes) -> bytes | None:
        """The message a frame from the router holds, or None to drop it: without
        `authenticate` every frame as it is; with it, a sealed frame opened on the channel
        (ChannelError when it does not open: the caller ends the channel) and, in clear, only
        the handshake's messages."""
        if not self.authenticate:
            return frame
        if is_sealed(frame):
            if self.channel is None:
                # Sealed for a channel we ended (a new handshake): never acted on.
                log.debug("worker %d dropped a frame of an ended channel", self.worker_id)
                return None
            return self.channel.open(frame)
        try:
            kind = decode(frame)["type"]
        except ProtocolError:
            kind = None
        if kind not in CLEAR_FROM_ROUTER:
            log.warning(
                "worker %d dropped a clear %r from %s: after the handshake every frame is sealed",
                self.worker_id,
                kind,
                self.router_addr,
            )
            return None
        if kind == "challenge":
            self._challenge_frame = frame
        return frame

    def answer(self, secret: bytes, msg: proto.Challenge, model: str) -> str | None:
        """End the handshake in progress on `msg`: our `register.auth` when the peer proved
        the secret for our `hello` (then `send_register` sends it and starts the channel),
        else None (the next `hello` goes out on the register timer)."""
        ours, self.hello_nonce = self.hello_nonce, None
        proven = (
            ours is not None
            and msg.handshake == handshake.HANDSHAKE_VERSION
            and msg.worker_id == self.worker_id
            and handshake.router_proven(secret, ours, msg.nonce, self.worker_id, msg.proof)
        )
        if ours is None or not proven:
            return None
        self._nonces = (bytes.fromhex(ours), bytes.fromhex(msg.nonce))
        return handshake.worker_proof(secret, ours, msg.nonce, self.worker_id, model)

    def send_register(self, secret: bytes, msg: proto.Register) -> None:
        """Send the `register` that answers the challenge (in clear), then seal everything
        after it with keys bound to this handshake's exact frames."""
        frame = encode(msg.to_wire())
        self._send_frame(frame, msg.TYPE)
        if msg.auth is not None:
            t = transcript_hash(self._hello_frame, self._challenge_frame, frame)
            self.channel = Channel(ChannelKeys.derive(secret, *self._nonces, t))

    def end_channel(self) -> None:
        """Drop the channel (a frame failed to open); the next `hello` starts another."""
        self.channel = None

    def recv_all(self) -> list[bytes]:
        """Every frame waiting on the socket, without blocking."""
        frames = []
        while True:
            try:
                frames.append(self.sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                return frames

    def send(self, msg: Message) -> None:
        """Send `msg`: sealed on the channel; with `authenticate` and no channel only `hello`
        and `register` leave (in clear), anything else is dropped."""
        frame = encode(msg.to_wire())
        if self.channel is not None:
            frame = self.channel.seal(frame)
        elif self.authenticate:
            if not isinstance(msg, (proto.Hello, proto.Register)):
                log.debug("worker %d has no channel: dropped a %s", self.worker_id, msg.TYPE)
                return
            if isinstance(msg, proto.Hello):
                self._hello_frame = frame
        self._send_frame(frame, msg.TYPE)

    def _send_frame(self, frame: bytes, kind: str) -> None:
        try:
            # NOTE: never block: with the router gone for long, the queue fills (SNDHWM) and a
            # blocking send would hang the loop, deaf to `stop()` and to signals.
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            log.warning("router not reachable: worker %d dropped a %s", self.worker_id, kind)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close()
