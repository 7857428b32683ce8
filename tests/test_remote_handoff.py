"""P/D across host worker processes, in one process: a TP-2 prefill group of a device pool
hands its requests to a TP-1 decode engine through the wire layout (pool/kv_wire.py) and the
handoff state (pool/remote_handoff.py), over an in-memory stand-in for the transport; the
tokens must be those of a mixed run. The real transport and router: tests/test_xhost_pd.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.kv_rendezvous import join_nixl, nixl_record
from nitsum.pool.local import local_engine
from nitsum.pool.nixl_agent import NixlUnavailable, load_nixl
from nitsum.pool.peers import PeerError
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from nitsum.worker.backend import PoolBackend
from nitsum.worker.inbound import GenerateRequest
from shapes import tp
from tiny import assert_pages_consistent, make_tiny, random_prompt, tiny_device_pool

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e

ECFG = EngineConfig(page_tokens=4, token_budget=64, tp_levels=(1, 2))
PAGES = 64


class LoopPeers:
    """The KV transport's interface, in memory: `send` hands the handoff to `other`."""

    def __init__(self, mine: list[int]) -> None:
        self.mine = mine
        self.other: LoopPeers | None = None
        self.inbox: list[tuple[dict[str, Any], torch.Tensor]] = []
        self.broken = False

    def serves(self, worker_id: int) -> bool:
        return worker_id not in self.mine

    def send(self, worker_id: int, meta: dict[str, Any], kv: torch.Tensor) -> int:
        if self.broken:
            raise PeerError(f"KV handoff to worker {worker_id} failed: test")
        assert self.other is not None
        self.other.inbox.append((meta, kv.clone()))
        return kv.numel() * kv.element_size()

    def pending(self) -> bool:
        return bool(self.inbox)

    def arrivals(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        out, self.inbox = self.inbox, []
        return out


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


@pytest.fixture(scope="module")
def pool(tiny):
    with tiny_device_pool(tiny, ECFG, devices=2, pages=PAGES, levels=(1, 2)) as p:
        yield p


def backends(tiny, pool, decode_pages: int = PAGES) -> tuple[PoolBackend, PoolBackend]:
    """Process A: worker ids 0-1 as one TP-2 group; process B: worker id 2, one device."""
    hf, cfg = tiny
    a = PoolBackend(PoolEngine(pool, cfg, ECFG, PAGES, [tp(0, 1)]), first_id=0)
    ecfg = EngineConfig(page_tokens=4, token_budget=64, kv_cache_bytes=decode_pages * 4 * 512)
    b = PoolBackend(local_engine(cfg, hf.state_dict().items(), ecfg), first_id=2)
    pa, pb = LoopPeers([0, 1]), LoopPeers([2])
    pa.other, pb.other = pb, pa
    a.attach_peers(pa)  # type: ignore[arg-type]
    b.attach_peers(pb)  # type: ignore[arg-type]
    return a, b


def nixl_backends(tiny, pool, decode_pages: int = PAGES, timeout_s: float = 5.0):
    """`backends`, joined by the NIXL transport (pool/kv_rendezvous.py `join_nixl`)."""
    try:
        load_nixl()
    except NixlUnavailable as e:
        pytest.skip(str(e))
    a, b = backends(tiny, pool, decode_pages)
    made = [nixl_record(be.pe.pool, be.device_ids) for be in (a, b)]
    records = [rec | {"ids": be.device_ids} for (_, rec), be in zip(made, (a, b), strict=True)]
    for rank, be in enumerate((a, b)):
        be.attach_peers(
            join_nixl(records, rank, made[rank][0], be.pe.pool, be.device_ids, timeout_s)
        )
    return a, b


REQS = {
    "g1": (5, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)),
    "g2": (23, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)),
    "s1": (11, SamplingParams(max_tokens=7, temperature=0.8, seed=5, ignore_eos=True)),
}


def run(a: PoolBackend, b: PoolBackend, cfg) -> tuple[dict[str, list[int]], dict[str, set]]:
    """Serve REQS with decode target 2; every backend's tokens and moves, by request."""
    for i, (rid, (n, sp)) in enumerate(REQS.items()):
        ids = random_prompt(cfg, n, seed=i)
        a.add(0, GenerateRequest(rid, ids, RequestSpec(sp, tier="strict", decode_target=2)))
    out: dict[str, list[int]] = {}
    seen: dict[str, set] = {"a": set(), "b": set(), "left": set(), "came": set()}
    deadline = time.monotonic() + 60  # NOTE: NIXL notifications arrive on a thread: poll
    while time.monotonic() < deadline:
        if not (a.has_unfinished() or b.has_unfinished()):
            break
        time.sleep(0.001)
        for name, be in (("a", a), ("b", b)):
            if be.has_unfinished():
                for o in be.step():
                    out.setdefault(o.request_id, []).extend(o.new_token_ids)
                    seen[name].add(o.request_id)
                left, came = be.moved()
                seen["left"] |= set(left)
                seen["came"] |= {(rid, dev, p) for rid, dev, p in came}
    return out, seen


def reference(tiny) -> dict[str, list[int]]:
    hf, cfg = tiny
    pe = local_engine(cfg, hf.state_dict().items(), EngineConfig(page_tokens=4))
    for i, (rid, (n, sp)) in enumerate(REQS.items()):
        pe.add_request(rid, random_prompt(cfg, n, seed=i), RequestSpec(sp))
    out: dict[str, list[int]] = {}
    while pe.has_unfinished():
        for o in pe.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


# NOTE: over NIXL, with agents of this process and of the device processes: real READs.
@pytest.mark.parametrize("joined", [backends, nixl_backends], ids=["gloo", "nixl"])
def test_tp2_prefill_hands_off_to_a_tp1_decoder_with_the_tokens_of_a_mixed_run(tiny, pool, joined):
    a, b = joined(tiny, pool)
    out, seen = run(a, b, tiny[1])
    assert out == reference(tiny)
    # A streamed nothing (the first token travels with the KV); B streamed everything.
    assert seen["a"] == set() and seen["b"] == set(REQS)
    assert seen["left"] == set(REQS)
    assert seen["came"] == {(rid, 2, n) for rid, (n, _) in REQS.items()}
    ca, cb = a.counters(), b.counters()
    assert (ca["kv_remote_out"], cb["kv_remote_in"], ca["kv_remote_failed"]) == (3, 3, 0)
    assert cb["kv_remote_recomputed"] == 0
    per_token = 2 * 2 * 4 * 8 * 4  # layers x K,V x KV heads x head dim x fp32 bytes
    assert ca["kv_remote_bytes"] == per_token * sum(n for n, _ in REQS.values())
    assert_pages_consistent(a.pe)
    assert_pages_consistent(b.pe)
    assert a.pe.free_pages(0) == a.pe.free_pages(1) == PAGES  # A kept no KV (NIXL: freed on took)


def test_a_failed_send_decodes_on_the_prefill_side(tiny, pool):
    a, b = backends(tiny, pool)
    a.remote.peers.broken = True  # type: ignore[union-attr]
    out, seen = run(a, b, tiny[1])
    assert out == reference(tiny)
    assert seen["a"] == set(REQS) and seen["b"] == set() and seen["left"] == set()
    assert a.counters()["kv_remote_failed"] == 3


def test_an_arrival_without_room_is_recomputed_on_the_decode_side(tiny, pool):
    # 8 pages of 4 tokens: the first two arrivals' KV (2 + 6 pages) fills them, so the third
    # is adopted without KV and prefilled again on the decode side once pages free up.
    a, b = backends(tiny, pool, decode_pages=8)
    out, _ = run(a, b, tiny[1])
    assert out == reference(tiny)
    assert (b.counters()["kv_remote_in"], b.counters()["kv_remote_recomputed"]) == (3, 1)


def test_over_nixl_an_offer_without_room_rolls_back_and_decodes_where_prefilled(tiny, pool):
    # 8 pages on B: the third offer finds none free and is refused; A still has its KV.
    a, b = nixl_backends(tiny, pool, decode_pages=8)
    out, seen = run(a, b, tiny[1])
    assert out == reference(tiny)
    refused = seen["a"]
    assert len(refused) == 1 and seen["b"] == set(REQS) - refused
    assert (a.counters()["kv_remote_failed"], b.counters()["kv_remote_recomputed"]) == (1, 0)
    assert a.pe.free_pages(0) == PAGES


def test_over_nixl_an_offer_nobody_answers_is_taken_back_after_its_deadline(tiny, pool):
    a, b = nixl_backends(tiny, pool, timeout_s=0.3)
    for i, (rid, (n, sp)) in enumerate(REQS.items()):
        ids = random_prompt(tiny[1], n, seed=i)
        a.add(0, GenerateRequest(rid, ids, RequestSpec(sp, tier="strict", decode_target=2)))
    out: dict[str, list[int]] = {}
    for _ in range(400):  # B is silent (not stepped): every offer expires after 0.6 s
        if not a.has_unfinished():
            break
        for o in a.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        time.sleep(0.01)
    assert out == reference(tiny)
    assert a.counters()["kv_remote_failed"] == 3 and a.counters()["kv_remote_out"] == 0
    # B hears of them late, with their withdrawal: it reads none and adopts none.
    time.sleep(0.2)
    assert b.step() == [] and b.counters()["kv_remote_in"] == 0


@pytest.mark.parametrize("restarted", ["prefill", "decode"])
def test_over_nixl_a_device_restarted_alone_keeps_its_requests_out_of_the_transport(
    tiny, pool, restarted
):
    """A device restarted alone after a crash has no NIXL agent and its peers hold its dead
    one: no offer from its group, an offer to its group refused at once; every request
    still finishes with its tokens, decoded where it was prefilled."""
    a, b = nixl_backends(tiny, pool)
    side = a if restarted == "prefill" else b
    side.pe.solo.add(0)  # as pool/device_loss.py marks a device restarted alone
    out, seen = run(a, b, tiny[1])
    assert out == reference(tiny)
    assert seen["a"] == set(REQS) and seen["b"] == set() and seen["came"] == set()
    assert a.counters()["kv_remote_out"] == 0
    # The decode side refused each offer when it came (none waited for its deadline).
    assert a.counters()["kv_remote_failed"] == (3 if restarted == "decode" else 0)
