"""One device id's connection to the router: a DEALER socket, its monitor, register/heartbeat.

A host worker owns one link per device it serves, so the router sees one worker per device
(docs/protocol.md). The link knows nothing about engines: the server builds the messages.
"""

from __future__ import annotations

import logging
import secrets
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from nitsum.worker.codec import Message, encode

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20  # a larger message drops the connection (docs/security.md)


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
    ) -> None:
        self.worker_id = worker_id
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

    def on_monitor(self) -> None:
        """Track the connection; when it comes back (a restarted router), re-register now."""
        event = recv_monitor_message(self.monitor)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            log.warning("worker %d lost the router; will re-register", self.worker_id)
            self.registered = False
            self._lost = True
        elif event == zmq.EVENT_CONNECTED and self._lost:
            self._lost = False
            self.next_register = time.monotonic()
        # The first connect needs nothing: the register queued before it goes out by itself.

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
