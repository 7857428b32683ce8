"""The worker's half of the mutual handshake (docs/protocol.md "Handshake", docs/security.md).

The worker opens with `hello` and its own nonce; the router's `challenge` carries the router's
nonce and `proof = HMAC-SHA256(secret, ROUTER_LABEL ‖ worker nonce ‖ router nonce ‖ worker_id)`;
the worker checks that proof before it sends anything else, and answers `register` with
`auth = HMAC-SHA256(secret, WORKER_LABEL ‖ worker nonce ‖ router nonce ‖ worker_id ‖ model)`.
The router's side is scheduler-rs `worker_auth` (the same test vectors pin both). Version 3
kept version 2's proofs and added the sealed channel the handshake ends in (channel.py): the
keys are bound to the exact `hello`, `challenge` and `register` frames.

NOTE: the labels differ (same length), so one side's proof never passes for the other's; both
nonces are in both proofs, so a proof made for one handshake (e.g. a relay's own `hello` to the
real router) passes in no other.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from nitsum.codec import ProtocolError

HANDSHAKE_VERSION = 3  # in `hello` and `challenge`; 2 had no sealed frames
ROUTER_LABEL = b"nitsum-handshake-v2 router"
WORKER_LABEL = b"nitsum-handshake-v2 worker"
NONCE_BYTES = 32


def new_nonce() -> str:
    """A fresh worker nonce: 64 lowercase hex characters from the OS CSPRNG."""
    return secrets.token_hex(NONCE_BYTES)


def _nonce(name: str, value: str) -> bytes:
    try:
        raw = bytes.fromhex(value)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"handshake: {name!r} must be hex, got {value!r}") from e
    if len(raw) != NONCE_BYTES:
        raise ProtocolError(f"handshake: {name!r} must be {NONCE_BYTES} bytes, got {len(raw)}")
    return raw


def _mac(
    secret: bytes, label: bytes, worker_nonce: str, router_nonce: str, worker_id: int, model: str
) -> str:
    if not 0 <= worker_id < 2**32:
        raise ProtocolError(f"handshake: worker id {worker_id} is not a u32")
    body = label + _nonce("worker nonce", worker_nonce) + _nonce("nonce", router_nonce)
    body += worker_id.to_bytes(4, "big") + model.encode()
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def router_proof(secret: bytes, worker_nonce: str, router_nonce: str, worker_id: int) -> str:
    """The proof a router that knows `secret` puts in `challenge.proof` (hex)."""
    return _mac(secret, ROUTER_LABEL, worker_nonce, router_nonce, worker_id, "")


def worker_proof(
    secret: bytes, worker_nonce: str, router_nonce: str, worker_id: int, model: str
) -> str:
    """The worker's proof in `register.auth` (hex)."""
    return _mac(secret, WORKER_LABEL, worker_nonce, router_nonce, worker_id, model)


def router_proven(
    secret: bytes, worker_nonce: str, router_nonce: str, worker_id: int, proof: str
) -> bool:
    """Whether `proof` shows the router knows `secret`, for this handshake's nonces and id.
    NOTE: compared in constant time; a malformed nonce or proof is simply not a proof."""
    try:
        want = router_proof(secret, worker_nonce, router_nonce, worker_id)
    except ProtocolError:
        return False
    return hmac.compare_digest(want, proof.lower()) if proof.isascii() else False
