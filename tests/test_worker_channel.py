"""The worker's sealed channel (nitsum.worker.channel): the shared vectors the router checks too
(tests/golden/channel_v3.json, scheduler-rs `channel_tests.rs`), and that a frame opens once,
in order, unmodified, with its own direction's key only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nitsum.worker.channel import (
    HEADER_BYTES,
    Channel,
    ChannelError,
    ChannelKeys,
    Opener,
    Sealer,
    transcript_hash,
)

GOLDEN = Path(__file__).resolve().parent / "golden" / "channel_v3.json"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))


def test_the_shared_vectors_hold() -> None:
    v = json.loads(GOLDEN.read_text())
    frames = [bytes.fromhex(v[k]) for k in ("hello", "challenge", "register")]
    t = transcript_hash(*frames)
    assert t.hex() == v["transcript"]
    keys = ChannelKeys.derive(
        v["secret"].encode(), bytes.fromhex(v["worker_nonce"]), bytes.fromhex(v["router_nonce"]), t
    )
    assert (keys.to_router.hex(), keys.to_worker.hex()) == (v["to_router_key"], v["to_worker_key"])
    for direction, key in (("to_router", keys.to_router), ("to_worker", keys.to_worker)):
        tx, rx = Sealer(key), Opener(key)
        for f in v[direction]:
            plain, sealed = bytes.fromhex(f["plain"]), bytes.fromhex(f["sealed"])
            assert tx.seal(plain) == sealed
            assert rx.open(sealed) == plain
    # The fixture is what the generator writes (regenerate it deliberately).
    from regen_channel_vectors import vectors

    assert vectors() == v


def keys() -> ChannelKeys:
    return ChannelKeys.derive(b"0123456789abcdef-secret", b"\1" * 32, b"\2" * 32, b"\3" * 32)


def test_frames_open_once_in_order_and_only_unmodified() -> None:
    k = keys()
    assert k.to_router != k.to_worker and "redacted" in repr(k)
    tx, rx = Sealer(k.to_router), Opener(k.to_router)
    f0, f1, f2 = tx.seal(b"first"), tx.seal(b"second"), tx.seal(b"third")
    assert f0[0] == 0xC1 and b"first" not in f0
    with pytest.raises(ChannelError, match="sequence 2, expected 0"):
        rx.open(f2)  # f0 and f1 dropped
    assert rx.open(f0) == b"first"
    with pytest.raises(ChannelError, match="sequence"):
        rx.open(f0)  # replayed
    for i in (0, 5, HEADER_BYTES, len(f1) - 1):
        bad = bytearray(f1)
        bad[i] ^= 1
        with pytest.raises(ChannelError):
            rx.open(bytes(bad))
    with pytest.raises(ChannelError, match="not a sealed frame"):
        rx.open(f1[: HEADER_BYTES + 3])
    assert rx.open(f1) == b"second" and rx.open(f2) == b"third"
    with pytest.raises(ChannelError, match="forged"):
        Opener(k.to_worker).open(Sealer(k.to_router).seal(b"x"))  # the other direction's key


def test_the_worker_side_seals_up_and_opens_down() -> None:
    k = keys()
    worker = Channel(k)
    assert Opener(k.to_router).open(worker.seal(b"up")) == b"up"
    assert worker.open(Sealer(k.to_worker).seal(b"down")) == b"down"
    with pytest.raises(ChannelError):
        worker.open(Sealer(k.to_router).seal(b"reflected"))  # our own frame sent back
