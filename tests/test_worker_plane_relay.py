"""An attacker on the network path between the real worker and the real router (docs/security.md):
a TCP relay that parses ZMTP framing. After the handshake it reads nothing (every frame is
sealed, worker/channel.py) and what it injects, modifies, replays or drops never reaches the
client: the frame fails to open, the channel closes, the worker authenticates again and the
request resumes on it with the genuine answer.

On a worker plane without sealing the relay reads the prompt (the first assertion fails)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest

from plane import RealWorker, Router, bounded_run, wait
from test_router_protocol import BIN
from zmtp_relay import Attack, Relay

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")]

PROMPT = [104, 105, 106, 107, 108, 109, 110, 111]
N = 6
ANSWER = (PROMPT * 2)[:N]  # the echo backend's genuine output
FORGED = 66
# What must never cross in clear: the prompt's bytes and these keys (msgpack strings, so a
# longer clear key such as `kv_capacity_tokens` in `register` does not count).
SECRETS = [msgpack.packb(PROMPT)] + [
    msgpack.packb(k) for k in ("generate", "input_ids", "tokens", "finish_reason")
]


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """Every test is bounded (plane.bounded_run)."""
    with bounded_run(90):
        yield


@pytest.fixture
def path(tmp_path: Path) -> Iterator[tuple[Router, Relay, RealWorker]]:
    """The real router, the relay in front of its worker endpoint, the real worker behind it
    (0.1 s per token, so a request is in flight while the relay acts)."""
    router = Router(tmp_path, log_level="warn")
    host, port = router.addr.removeprefix("tcp://").rsplit(":", 1)
    relay = Relay((host, int(port)))
    worker = RealWorker(relay.addr, delay=0.1, heartbeat_every_s=0.1, register_every_s=0.5)
    try:
        yield router, relay, worker
    finally:
        worker.stop()
        relay.close()
        router.stop()


def clear_leaks(relay: Relay) -> list[bytes]:
    """Every secret that crossed the relay in clear."""
    return [s for s in SECRETS for _, body in relay.seen if s in body]


def test_the_relay_reads_nothing(path: tuple[Router, Relay, RealWorker]) -> None:
    router, relay, _ = path
    assert router.generate(PROMPT, N, timeout=20) == ANSWER
    assert any(d == "down" for d, _ in relay.seen) and any(d == "up" for d, _ in relay.seen)
    assert clear_leaks(relay) == [], "the relay read the worker plane in clear"
    assert router.rejected("bad_frame") == 0


def run_during(router: Router, worker: RealWorker, act: Callable[[str], None]) -> list[int]:
    """A request; `act(request id)` once the worker runs it; the client's output ids."""
    out: list[list[int]] = []
    t = threading.Thread(target=lambda: out.append(router.generate(PROMPT, N, timeout=30)))
    t.start()
    wait(lambda: worker.backend.seen_ids, what="the worker runs the request")
    act(worker.backend.seen_ids[0])
    t.join(40)
    assert out, "the request did not end"
    return out[0]


def injected_stop(rid: str) -> bytes:
    """What the attack of issue 40 injected: a clear `tokens` ending the request with a lie."""
    msg = {"v": 1, "type": "tokens", "worker_id": 0, "request_id": rid, "token_ids": [FORGED]}
    return msgpack.packb(msg | {"finish_reason": "stop", "prompt_tokens": len(PROMPT)})


@pytest.mark.parametrize("kind", ["inject", "modify", "replay", "drop"])
def test_a_tampered_worker_frame_closes_the_channel_and_forges_nothing(
    path: tuple[Router, Relay, RealWorker], kind: str
) -> None:
    router, relay, worker = path

    def act(rid: str) -> None:
        a = relay.arm(Attack("up", kind, injected_stop(rid)))
        wait(a.done.is_set, what="the relay acted")

    output = run_during(router, worker, act)
    assert FORGED not in output
    # NOTE: tokens streamed before the attack stay; the request resumed from them (the echo
    # backend then echoes the longer prompt), so every id is the worker's, none the relay's.
    assert len(output) == N and set(output) <= set(PROMPT), output
    wait(lambda: router.rejected("bad_frame") >= 1, what="the router closed the channel")
    # The worker authenticated again and serves.
    wait(lambda: worker.server.registered and router.workers() == 1, what="worker back")
    assert router.generate(PROMPT, N, timeout=20) == ANSWER
    assert clear_leaks(relay) == []


def test_a_tampered_router_frame_closes_the_channel(
    path: tuple[Router, Relay, RealWorker], caplog: pytest.LogCaptureFixture
) -> None:
    router, relay, worker = path
    a = relay.arm(Attack("down", "modify"))
    # The `generate` is the next frame down: the worker cannot open it, ends the channel and
    # authenticates again; the router resumes the request on it.
    assert router.generate(PROMPT, N, timeout=30) == ANSWER
    assert a.done.is_set()
    assert "failed to open" in caplog.text
    time.sleep(0.2)
    assert router.generate(PROMPT, N, timeout=20) == ANSWER
    assert clear_leaks(relay) == []
