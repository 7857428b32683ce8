"""The sealed worker plane (handshake 3) for test fakes: a fake worker's end and a fake router's
ends of each connection's channel, built on the worker's own channel.py, so fakes speak exactly
what the real router and worker speak (docs/protocol.md "Sealed frames")."""

from __future__ import annotations

from typing import Any

import msgpack

from nitsum.worker.channel import (
    Channel,
    ChannelKeys,
    Opener,
    Sealer,
    is_sealed,
    transcript_hash,
)

SEALED_UNREAD = "<sealed>"  # the type of a sealed frame this end has no channel to open


def packb(msg: dict[str, Any]) -> bytes:
    """A message's clear frame."""
    return msgpack.packb(msg, use_bin_type=True)


class WorkerEnd:
    """A fake worker's side: the exact `hello` frames it sent (by nonce), then its channel."""

    def __init__(self) -> None:
        self.hellos: dict[str, bytes] = {}
        self.channel: Channel | None = None

    def hello(self, msg: dict[str, Any]) -> bytes:
        """The frame of `hello` `msg` (its nonce remembered for the transcript)."""
        raw = packb(msg)
        self.hellos[msg["nonce"]] = raw
        return raw

    def register(self, secret: bytes, nonce: str, challenge: bytes, msg: dict[str, Any]) -> bytes:
        """The frame of `register` `msg` answering the raw `challenge` of our hello `nonce`;
        everything after it is sealed with this handshake's keys."""
        raw = packb(msg)
        theirs = msgpack.unpackb(challenge, raw=False)["nonce"]
        t = transcript_hash(self.hellos[nonce], challenge, raw)
        keys = ChannelKeys.derive(secret, bytes.fromhex(nonce), bytes.fromhex(theirs), t)
        self.channel = Channel(keys)
        return raw

    def frame(self, msg: dict[str, Any]) -> bytes:
        """`msg` as sent now: sealed once the channel is up (the handshake never is)."""
        raw = packb(msg)
        clear = self.channel is None or msg.get("type") in ("hello", "register")
        return raw if clear else self.channel.seal(raw)

    def read(self, frame: bytes) -> dict[str, Any]:
        """A frame from the router, decoded (opened when sealed)."""
        if is_sealed(frame):
            if self.channel is None:
                return {"type": SEALED_UNREAD}
            frame = self.channel.open(frame)
        return msgpack.unpackb(frame, raw=False)


class RouterEnds:
    """A fake router's side of each worker connection: the handshake frames and, after a
    `register` answering its challenge (with `secret`), that connection's channel."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self.hello: dict[bytes, tuple[bytes, str]] = {}  # peer -> (frame, worker nonce)
        self.challenge: dict[bytes, tuple[bytes, str]] = {}  # peer -> (frame, router nonce)
        self.channels: dict[bytes, tuple[Sealer, Opener]] = {}

    def read(self, peer: bytes, frame: bytes) -> dict[str, Any]:
        """A frame from `peer`, decoded (opened when sealed; the handshake recorded)."""
        if is_sealed(frame):
            if peer not in self.channels:
                return {"type": SEALED_UNREAD}
            frame = self.channels[peer][1].open(frame)
            return msgpack.unpackb(frame, raw=False)
        msg = msgpack.unpackb(frame, raw=False)
        if not isinstance(msg, dict):
            return {"type": None}
        if msg.get("type") == "hello":
            self.hello[peer] = (frame, str(msg.get("nonce")))
            self.channels.pop(peer, None)
        elif (
            msg.get("type") == "register"
            and msg.get("auth")
            and self.secret is not None
            and peer in self.hello
            and peer in self.challenge
        ):
            (h, ours), (c, theirs) = self.hello[peer], self.challenge[peer]
            t = transcript_hash(h, c, frame)
            keys = ChannelKeys.derive(self.secret, bytes.fromhex(ours), bytes.fromhex(theirs), t)
            self.channels[peer] = (Sealer(keys.to_worker), Opener(keys.to_router))
        return msg

    def frame(self, peer: bytes, msg: dict[str, Any]) -> bytes:
        """`msg` for `peer` as sent now: the handshake in clear, anything else sealed once the
        channel is up."""
        raw = packb(msg)
        if msg.get("type") == "challenge":
            self.challenge[peer] = (raw, str(msg.get("nonce")))
            return raw
        channel = self.channels.get(peer)
        return raw if channel is None else channel[0].seal(raw)
