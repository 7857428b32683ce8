"""Runtime TP switching on 4 CPU devices (shared-memory collectives; gloo too for the
logits): shard views, logits, migration, rollback."""

from dataclasses import replace

import pytest
import torch

from device_probes import fill_kv, kv_of_slots, kv_source_timeout, shards_share_storage
from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.parallel.topology import GroupShape, TPTopology
from nitsum.pool.device_commands import Counters, Migrate, Probe
from nitsum.pool.faults import FaultPlan
from nitsum.pool.kv_transfer import TransferFailed
from nitsum.pool.migration_plan import Piece
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from shapes import layout, tp
from tiny import (
    POOL_ECFG,
    POOL_PAGES,
    assert_pages_consistent,
    drain,
    make_tiny,
    tiny_device_pool,
)

ECFG, NUM_PAGES = POOL_ECFG, POOL_PAGES
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
TP1, TP2, TP4 = layout((0,), (1,), (2,), (3,)), layout((0, 1), (2, 3)), layout((0, 1, 2, 3))


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


@pytest.fixture(scope="module")
def pool(tiny):
    with tiny_device_pool(tiny) as p:
        yield p


def prompts(cfg, n=8):
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, cfg.vocab_size, (6 + 5 * i,), generator=g).tolist() for i in range(n)]


def reference_tokens(tiny, ps):
    hf, cfg = tiny
    e = build_engine(
        cfg, hf.state_dict().items(), EngineConfig(kv_cache_bytes=4 << 20, page_tokens=4)
    )
    for i, p in enumerate(ps):
        e.add_request(f"r{i}", p, RequestSpec(GREEDY))
    return drain(e)


def assert_all_pages_back(pe):
    """Nothing leaked: with every request done, closing the groups (which frees their
    prefix caches) leaves every page of every device free."""
    assert_pages_consistent(pe)
    for engine in pe.engines.values():
        engine.close()
    for device in range(pe.pool.num_devices):
        assert pe.alloc.num_free(device) == NUM_PAGES


@pytest.fixture(scope="module")
def gloo_pool(tiny):
    """The same devices with their collectives over gloo process groups (`dist`), where the
    default on CPU is shared memory."""
    with tiny_device_pool(tiny, replace(ECFG, collectives="dist")) as p:
        yield p


def groups_expected(kind: str, device: int) -> int:
    """Communicators a device creates at start-up: every aligned group's process group
    (new_group is collective), or the shared groups it is a member of."""
    groups = TPTopology(4, (1, 2, 4)).aligned_groups()
    return len(groups) if kind == "dist" else sum(g.holds(device) for g in groups)


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["shared", "dist"])
def test_shards_are_views_and_no_group_is_created_later(pool, gloo_pool, kind):
    devices = pool if kind == "shared" else gloo_pool
    for d in range(4):
        stats = devices.call(d, Counters())
        assert stats["collectives"] == kind
        assert stats["groups_created"] == groups_expected(kind, d)
        for members in stats["contexts"]:
            assert devices.call(d, Probe(shards_share_storage, (members,)))


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["shared", "dist"])
def test_logits_equal_at_tp_1_2_4(pool, gloo_pool, tiny, kind):
    pool = pool if kind == "shared" else gloo_pool
    hf, cfg = tiny
    ids = prompts(cfg, 1)[0] + [3, 1, 4, 1, 5]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    pe = PoolEngine(pool, cfg, ECFG, NUM_PAGES, TP1)
    for group in ([(0,)], [(0, 1)], [(0, 1, 2, 3)]):
        pages = pe.alloc.group(group[0], len(group[0]))
        seq = Sequence("x", ids, RequestSpec(GREEDY))
        seq.pages = pages.allocate(pages.pages_for(len(ids)))
        inputs = build = pe.new_engine(GroupShape.tp_group(group[0])).runner.prepare(
            [Scheduled(seq, 0, len(ids))]
        )
        pool.launch_step(group[0], build)
        logits = pool.collect_step(group[0])[0]
        pages.release(seq.pages)
        assert (logits - ref).abs().max().item() <= 1e-4, f"TP {len(group[0])}"
        del inputs


@pytest.mark.e2e
def test_switch_mid_decode_keeps_greedy_tokens(pool, tiny):
    hf, cfg = tiny
    ps = prompts(cfg)
    ref = reference_tokens(tiny, ps)
    pe = PoolEngine(pool, cfg, ECFG, NUM_PAGES, TP1)
    for i, p in enumerate(ps):
        pe.add_request(f"r{i}", p, RequestSpec(GREEDY))
    out: dict[str, list[int]] = {}
    reports = []
    for plan in (TP2, TP4, TP2, TP1):
        drain(pe, out, steps=4)
        report = pe.reconfigure(plan)
        assert report.ok, report.error
        assert pe.groups == plan
        assert_pages_consistent(pe)
        reports.append(report)
    drain(pe, out)
    assert out == ref
    assert all(r.moved_requests > 0 and r.bytes_moved > 0 for r in reports)
    assert_all_pages_back(pe)


@pytest.mark.e2e
def test_failed_transfer_rolls_back_and_requests_finish(pool, tiny):
    hf, cfg = tiny
    ps = prompts(cfg, 4)
    ref = reference_tokens(tiny, ps)
    pe = PoolEngine(pool, cfg, ECFG, NUM_PAGES, TP1)
    for i, p in enumerate(ps):
        pe.add_request(f"r{i}", p, RequestSpec(GREEDY))
    out = drain(pe, steps=5)
    before = pe.page_accounting()
    report = pe.reconfigure(TP2, faults=FaultPlan(transfer=(1, 0)))  # piece 1: device 0 -> 1
    assert not report.ok and "failed" in report.error
    assert pe.groups == TP1
    assert pe.page_accounting() == before
    # The pool is still healthy: a later switch works, and outputs are unchanged.
    drain(pe, out, steps=3)
    assert pe.reconfigure(TP4).ok
    drain(pe, out)
    assert out == {k: ref[k] for k in out}
    assert set(out) == set(ref)


@pytest.mark.e2e
def test_prefill_group_hands_kv_to_decode_group(pool, tiny):
    """Disaggregation: TP-2 prefill group, two TP-1 decode groups; same greedy tokens."""
    hf, cfg = tiny
    ps = prompts(cfg, 4)
    ref = reference_tokens(tiny, ps)
    pe = PoolEngine(pool, cfg, ECFG, NUM_PAGES, layout((0, 1), (2,), (3,)))
    for i, p in enumerate(ps):
        pe.add_request(
            f"r{i}",
            p,
            RequestSpec(GREEDY),
            group=tp(0, 1),
            decode_group=tp(2 + i % 2),
        )
    out = drain(pe, steps=6)
    # Every prompt fits the budget, so all prefills are done and handed off by now.
    assert not pe.engines[tp(0, 1)].seqs
    assert {r for e in (pe.engines[tp(2)], pe.engines[tp(3)]) for r in e.seqs} == set(ref)
    assert pe.counters["kv_handoff_bytes"] > 0
    assert_pages_consistent(pe)
    drain(pe, out)
    assert out == ref
    assert_all_pages_back(pe)


def test_tp_levels_outside_the_heads_are_refused_clearly(tiny):
    """TP 8 replicates the 4 KV heads (tests/test_kv_replication.py); 3 and 16 cannot run."""
    from nitsum.parallel.shard import HeadRange

    _, cfg = tiny
    assert cfg.allowed_tp_levels((1, 2, 3, 4, 8, 16)) == (1, 2, 4, 8)
    with pytest.raises(ValueError, match="KV heads \\(4\\) or be a multiple"):
        HeadRange.of(cfg, 3, 0)
    with pytest.raises(ValueError, match="query heads \\(8\\)"):
        HeadRange.of(cfg, 16, 0)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["pipelined", "pipelined_socket", "per_page"])
def test_migration_moves_exact_bytes_in_every_mode(pool, tiny, mode):
    """Device processes of one host copy chunks straight from the peer's mapped pages
    ("pipelined"), or hand them over gloo: the same bytes land in the same slots either way.
    Chunks are made small, so the socket's double buffers are reused many times; a failure
    stops both ends at the same chunk."""
    _, cfg = tiny
    slot_bytes = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4
    pool.call(0, Probe(fill_kv, (3, 5 * slot_bytes)))  # 5 tokens a chunk
    pool.call(1, Probe(fill_kv, (4, 5 * slot_bytes)))
    g = torch.Generator().manual_seed(1)
    src = torch.randperm(NUM_PAGES * 4, generator=g)[:97]
    dst = torch.randperm(NUM_PAGES * 4, generator=g)[:97]
    piece = Piece(0, 1, 1, 0, 1, 0, cfg.num_kv_heads, src, dst)
    want = pool.call(0, Probe(kv_of_slots, (src,)))
    try:
        sent, received = pool.migrate([piece], mode)
        assert torch.equal(pool.call(1, Probe(kv_of_slots, (dst,))), want)
        assert sent.bytes_sent == received.bytes_received == 97 * slot_bytes
        chunks = 97 if mode == "per_page" else 20
        assert received.messages >= chunks
        # In place, only the receiver works: the sender just has its pages read.
        assert (sent.messages == 0) if mode == "pipelined" else (sent.messages >= chunks)
        assert received.direct_copies == (20 if mode == "pipelined" else 0)
        if mode != "per_page":
            # An injected failure after 3 chunks: both ends stop there, the caller is told,
            # and the next migration (fresh chunk names) is whole again.
            with pytest.raises(TransferFailed):
                pool.migrate([piece], mode, faults=FaultPlan(transfer=(0, 3)))
            pool.call(1, Probe(fill_kv, (4, 5 * slot_bytes)))
            pool.migrate([piece], mode)
            assert torch.equal(pool.call(1, Probe(kv_of_slots, (dst,))), want)
    finally:
        for d in (0, 1):
            pool.call(d, Probe(fill_kv, (d, 8 << 20)))  # back to the default chunk


@pytest.mark.e2e
def test_direct_pieces_both_ways_and_repeated(pool, tiny):
    """One migration where device 0 sends, then receives, then sends to another peer,
    repeated: each receiver reads its source's pages in place once they are ready for that
    migration, and gets exactly their bytes."""
    _, cfg = tiny
    slot_bytes = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4
    for d in (0, 1, 2):
        pool.call(d, Probe(fill_kv, (10 + d, 7 * slot_bytes)))
    g = torch.Generator().manual_seed(2)
    src = [torch.randperm(NUM_PAGES * 4, generator=g)[:n] for n in (13, 5, 20)]
    dst = [torch.randperm(NUM_PAGES * 4, generator=g)[:n] for n in (13, 5, 20)]
    ends = [(0, 1), (1, 0), (0, 2)]
    pieces = [
        Piece(a, b, 1, 0, 1, 0, cfg.num_kv_heads, s, t)
        for (a, b), s, t in zip(ends, src, dst, strict=True)
    ]
    try:
        for _ in range(3):
            want = [
                pool.call(a, Probe(kv_of_slots, (s,))) for (a, _), s in zip(ends, src, strict=True)
            ]
            stats = pool.migrate(pieces)
            for (_, b), t, w in zip(ends, dst, want, strict=True):
                assert torch.equal(pool.call(b, Probe(kv_of_slots, (t,))), w)
            assert sum(s.direct_copies for s in stats) == 2 + 1 + 3  # the receivers' chunks
    finally:
        for d in (0, 1, 2):
            pool.call(d, Probe(fill_kv, (d, 8 << 20)))


@pytest.mark.e2e
def test_a_source_that_never_gets_ready_fails_the_move_and_the_pool_goes_on(pool, tiny):
    """The receiver of a move reads its source's pages only once the source marked them ready
    for that migration; a source that never does (here: never told of it) fails the move
    after the timeout, and the next migration, with both ends, is whole."""
    _, cfg = tiny
    g = torch.Generator().manual_seed(3)
    src, dst = (torch.randperm(NUM_PAGES * 4, generator=g)[:9] for _ in range(2))
    piece = Piece(0, 1, 1, 0, 1, 0, cfg.num_kv_heads, src, dst)
    pool.call(1, Probe(kv_source_timeout, (0.5,)))
    try:
        # Only the receiver hears of migration 10_000: device 0 never marks it ready.
        with pytest.raises(TransferFailed, match="device 0|did not make its pages ready"):
            pool.call(1, Migrate([piece], "pipelined", None, 10_000))
        want = pool.call(0, Probe(kv_of_slots, (src,)))
        pool.migrate([piece])
        assert torch.equal(pool.call(1, Probe(kv_of_slots, (dst,))), want)
    finally:
        pool.call(1, Probe(kv_source_timeout, (60.0,)))
