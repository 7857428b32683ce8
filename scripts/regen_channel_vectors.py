"""Write tests/golden/channel_v3.json: the sealed channel's test vectors (a fixed handshake's
exact frames, transcript hash, both keys, and sealed frames each way), which the worker's
tests (tests/test_worker_channel.py) and the router's (scheduler-rs worker_auth
`channel_tests.rs`) both check. Regenerate deliberately: a change here is a wire change."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack

from nitsum.worker.channel import ChannelKeys, Sealer, transcript_hash
from nitsum.worker.handshake import router_proof, worker_proof

OUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "channel_v3.json"
SECRET = "nitsum-test-secret-0001"
OURS, THEIRS = "ab" * 32, "cd" * 32


def vectors() -> dict[str, object]:
    """The fixture's content (deterministic)."""
    key = SECRET.encode()
    hello = {"v": 1, "type": "hello", "worker_id": 7, "handshake": 3, "nonce": OURS}
    proof = router_proof(key, OURS, THEIRS, 7)
    challenge = {"v": 1, "type": "challenge", "worker_id": 7, "handshake": 3}
    challenge |= {"nonce": THEIRS, "proof": proof}
    register = {"v": 1, "type": "register", "worker_id": 7, "model": "tiny"}
    register["auth"] = worker_proof(key, OURS, THEIRS, 7, "tiny")
    frames = [msgpack.packb(m, use_bin_type=True) for m in (hello, challenge, register)]
    t = transcript_hash(*frames)
    keys = ChannelKeys.derive(key, bytes.fromhex(OURS), bytes.fromhex(THEIRS), t)
    up = [
        {"v": 1, "type": "heartbeat", "worker_id": 7},
        {"v": 1, "type": "tokens", "worker_id": 7, "token_ids": [1, 2], "finish_reason": "stop"},
    ]
    down = [{"v": 1, "type": "registered", "worker_id": 7, "epoch": 1}, {"v": 1, "type": "x"}]

    def sealed(k: bytes, msgs: list[dict[str, object]]) -> list[dict[str, str]]:
        s = Sealer(k)
        plain = [msgpack.packb(m, use_bin_type=True) for m in msgs] + [b""]
        return [{"plain": p.hex(), "sealed": s.seal(p).hex()} for p in plain]

    return {
        "secret": SECRET,
        "worker_nonce": OURS,
        "router_nonce": THEIRS,
        "hello": frames[0].hex(),
        "challenge": frames[1].hex(),
        "register": frames[2].hex(),
        "transcript": t.hex(),
        "to_router_key": keys.to_router.hex(),
        "to_worker_key": keys.to_worker.hex(),
        "to_router": sealed(keys.to_router, up),
        "to_worker": sealed(keys.to_worker, down),
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(vectors(), indent=1) + "\n")
    print(f"wrote {OUT}")
