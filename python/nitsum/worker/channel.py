"""The worker's end of the sealed channel (handshake version 3, docs/protocol.md "Sealed frames").

After the handshake every frame, both ways, is `0xc1 ‖ seq (u64 big-endian) ‖
AES-256-GCM(msgpack) ‖ tag`, with the 9-byte header as associated data and the GCM nonce
`0⁴ ‖ seq`. Each direction has its own key: HKDF-SHA256 with salt = worker nonce ‖ router nonce,
IKM = the shared secret, info = the direction's label ‖ SHA-256(hello ‖ challenge ‖ register)
over the exact frames. The router's side is scheduler-rs `worker_auth/channel.rs`; both are
pinned by tests/golden/channel_v3.json.

NOTE (invariants): a key seals one direction only and its `seq` strictly increases from 0, so
no (key, nonce) pair repeats; a receiver accepts only the next `seq`, so a replayed, reordered
or dropped frame fails exactly like a forged one. `0xc1` is the one byte msgpack never uses.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEALED = 0xC1
HEADER_BYTES = 9
TAG_BYTES = 16
TO_ROUTER_LABEL = b"nitsum-channel-v3 worker->router"
TO_WORKER_LABEL = b"nitsum-channel-v3 router->worker"


class ChannelError(Exception):
    """A sealed frame that does not open: malformed, out of sequence, or forged."""


def is_sealed(frame: bytes) -> bool:
    """Whether `frame` is sealed (else a clear msgpack message)."""
    return frame[:1] == bytes([SEALED])


def transcript_hash(hello: bytes, challenge: bytes, register: bytes) -> bytes:
    """SHA-256 of the exact `hello`, `challenge` and `register` frames, in that order."""
    return hashlib.sha256(hello + challenge + register).digest()


@dataclass(frozen=True)
class ChannelKeys:
    """Both directions' keys of one handshake."""

    to_router: bytes
    to_worker: bytes

    def __repr__(self) -> str:
        return "ChannelKeys(<redacted>)"

    @classmethod
    def derive(
        cls, secret: bytes, worker_nonce: bytes, router_nonce: bytes, transcript: bytes
    ) -> ChannelKeys:
        """HKDF-SHA256 (module docstring)."""

        def key(label: bytes) -> bytes:
            hkdf = HKDF(
                algorithm=hashes.SHA256(),
                length=32,
                salt=worker_nonce + router_nonce,
                info=label + transcript,
            )
            return hkdf.derive(secret)

        return cls(key(TO_ROUTER_LABEL), key(TO_WORKER_LABEL))


def _nonce(seq: int) -> bytes:
    return bytes(4) + seq.to_bytes(8, "big")


class Sealer:
    """One direction's sending half."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self.next = 0

    def seal(self, plaintext: bytes) -> bytes:
        """`plaintext` sealed as the next frame."""
        seq = self.next
        self.next += 1
        header = bytes([SEALED]) + seq.to_bytes(8, "big")
        return header + self._aead.encrypt(_nonce(seq), plaintext, header)


class Opener:
    """One direction's receiving half."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self.next = 0

    def open(self, frame: bytes) -> bytes:
        """The plaintext of `frame` if it is this direction's next frame; ChannelError if not."""
        if not is_sealed(frame) or len(frame) < HEADER_BYTES + TAG_BYTES:
            raise ChannelError("not a sealed frame")
        seq = int.from_bytes(frame[1:HEADER_BYTES], "big")
        if seq != self.next:
            raise ChannelError(f"sequence {seq}, expected {self.next}")
        header = frame[:HEADER_BYTES]
        try:
            plain = self._aead.decrypt(_nonce(seq), frame[HEADER_BYTES:], header)
        except InvalidTag as e:
            raise ChannelError("forged or modified") from e
        self.next += 1
        return plain


class Channel:
    """The worker's side: seals to the router, opens from it."""

    def __init__(self, keys: ChannelKeys) -> None:
        self.sealer = Sealer(keys.to_router)
        self.opener = Opener(keys.to_worker)

    def seal(self, plaintext: bytes) -> bytes:
        """A frame for the router."""
        return self.sealer.seal(plaintext)

    def open(self, frame: bytes) -> bytes:
        """A frame from the router, opened (ChannelError when it does not)."""
        return self.opener.open(frame)
