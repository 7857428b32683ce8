"""KV-head replication: TP levels above the KV heads ("llama-kv2": 2 KV heads, 8 query heads,
so TP 4 holds each KV head on 2 ranks) on 4 CPU devices (gloo): levels, shard views, logits,
page capacity and migration through a replicated layout."""

from dataclasses import replace

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.kv.cache import KVCache
from nitsum.kv.pages import PageAllocator
from nitsum.parallel.shard import HeadRange, shard_views
from nitsum.parallel.shift import ShiftRule
from nitsum.parallel.topology import GroupShape
from nitsum.pool.migration_plan import Placement, plan_pieces
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from nitsum.weights.layout import build_weights
from shapes import layout
from tiny import (
    POOL_ECFG,
    POOL_PAGES,
    assert_pages_consistent,
    drain,
    hf_greedy,
    make_tiny,
    random_prompt,
    tiny_device_pool,
)

# TP only: every step of a group runs as TP (the shift rule's SP path is tested elsewhere).
ECFG = replace(POOL_ECFG, shift=ShiftRule(threshold=None))
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
TP1, TP2, TP4 = layout((0,), (1,), (2,), (3,)), layout((0, 1), (2, 3)), layout((0, 1, 2, 3))


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-kv2")


@pytest.fixture(scope="module")
def pool(tiny):
    with tiny_device_pool(tiny) as p:
        yield p


def prompts(cfg, n=6):
    return [random_prompt(cfg, 5 + 4 * i, seed=11 + i) for i in range(n)]


def test_levels_head_ranges_and_refusals(tiny):
    _, cfg = tiny
    assert cfg.allowed_tp_levels((1, 2, 3, 4, 8, 16)) == (1, 2, 4, 8)
    assert [cfg.kv_split(p) for p in (1, 2, 4, 8)] == [1, 2, 2, 2]
    assert [cfg.kv_heads_per_rank(p) for p in (1, 2, 4, 8)] == [2, 1, 1, 1]
    ranges = [HeadRange.of(cfg, 4, r) for r in range(4)]
    # (kv_start, kv_heads, q_start, q_heads): ranks 0,1 share KV head 0, ranks 2,3 head 1.
    got = [(h.kv_start, h.kv_heads, h.q_start, h.q_heads) for h in ranges]
    assert got == [(0, 1, 0, 2), (0, 1, 2, 2), (1, 1, 4, 2), (1, 1, 6, 2)]
    # A level that divides the KV heads keeps whole groups.
    gqa = make_tiny("llama-gqa")[1]
    h = HeadRange.of(gqa, 2, 1)
    assert (h.kv_start, h.kv_heads, h.q_start, h.q_heads) == (2, 2, 4, 4)
    with pytest.raises(ValueError, match=r"TP 3 .*KV heads \(2\) or be a multiple"):
        cfg.check_tp_level(3)
    with pytest.raises(ValueError, match=r"TP 16 .*query heads \(8\)"):
        cfg.check_tp_level(16)
    with pytest.raises(ValueError, match=r"TP 4 .*intermediate size \(130\)"):
        replace(cfg, intermediate_size=130).check_tp_level(4)


def _inside(view: torch.Tensor, full: torch.Tensor) -> bool:
    """`view`'s bytes lie inside `full`'s storage (a view of it, not a copy)."""
    base, size = full.untyped_storage().data_ptr(), full.untyped_storage().nbytes()
    start = view.data_ptr()
    return (
        view.untyped_storage().data_ptr() == base
        and base <= start
        and start + view.numel() * view.element_size() <= base + size
    )


@pytest.mark.parametrize("variant", ["llama-kv2", "qwen2-kv2"])
def test_replicated_shards_are_views_with_the_right_rows(variant):
    hf, cfg = make_tiny(variant)
    weights = build_weights(cfg, hf.state_dict().items(), mlp_blocks=4)
    hd = cfg.head_dim
    for rank in range(4):
        heads = HeadRange.of(cfg, 4, rank)
        q = slice(heads.q_start * hd, (heads.q_start + heads.q_heads) * hd)
        g = slice(heads.kv_start * hd, (heads.kv_start + 1) * hd)
        for shard, full, ref in zip(
            shard_views(weights, 4, rank), weights.layers, hf.model.layers, strict=True
        ):
            attn = ref.self_attn
            for name in ("qkv", "o_t", "gate_up", "down_t"):
                assert _inside(getattr(shard, name), getattr(full, name)), name
            assert _inside(shard.kv_proj, full.qkv)
            assert torch.equal(shard.qkv, attn.q_proj.weight[q])
            assert torch.equal(
                shard.kv_proj, torch.cat([attn.k_proj.weight[g], attn.v_proj.weight[g]])
            )
            assert torch.equal(shard.o_t, attn.o_proj.weight.t()[q])
            if cfg.attention_bias:
                assert _inside(shard.qkv_bias, full.qkv_bias)
                assert _inside(shard.kv_bias, full.qkv_bias)
                assert torch.equal(shard.qkv_bias, attn.q_proj.bias[q])
                kv_bias = torch.cat([attn.k_proj.bias[g], attn.v_proj.bias[g]])
                assert torch.equal(shard.kv_bias, kv_bias)
    # A level that divides the KV heads keeps one contiguous qkv slice and no kv view.
    assert all(s.kv_proj is None for s in shard_views(weights, 2, 1))


def test_page_capacity_follows_the_kv_split(tiny):
    _, cfg = tiny
    pool = KVCache(cfg, num_pages=4, page_tokens=4)
    assert [pool.tokens_per_page(p) for p in (1, 2, 4)] == [4, 8, 8]
    alloc = PageAllocator(4, 16, 4, cfg.num_kv_heads)
    assert [alloc.group(g, len(g)).tokens_per_page for g in ((0,), (0, 1), (0, 1, 2, 3))] == [
        4,
        8,
        8,
    ]
    # The flat (slots, local heads, hd) view of a replicated rank covers exactly the pages.
    k, _ = pool.kv(0, HeadRange.of(cfg, 4, 0).kv_heads)
    assert k.shape[0] == pool.num_pages * pool.tokens_per_page(4)


def test_plan_reads_each_head_once_preferring_a_local_replica():
    def plan(old, new):  # 2 KV heads, 2 layers, 4-token base pages, 5 tokens
        pieces = plan_pieces(
            2,
            2,
            4,
            5,
            Placement(GroupShape.tp_group(old), (0, 1)),
            Placement(GroupShape.tp_group(new), (2, 3)),
        )
        return sorted((p.src, p.dst, p.src_head, p.dst_head, p.heads) for p in pieces)

    # TP 1 → 4: every replica gets its head (head 1 lies at local head 1 of device 0).
    assert plan((0,), (0, 1, 2, 3)) == [
        (0, 0, 0, 0, 1),
        (0, 1, 0, 0, 1),
        (0, 2, 1, 0, 1),
        (0, 3, 1, 0, 1),
    ]
    # TP 4 → 2 on devices 2, 3: head 0 from its first replica (0), head 1 local on 3.
    assert plan((0, 1, 2, 3), (2, 3)) == [(0, 2, 0, 0, 1), (3, 3, 0, 0, 1)]
    # TP 4 → 1 on device 1: head 0 local (1 holds it), head 1 from device 2.
    assert plan((0, 1, 2, 3), (1,)) == [(1, 1, 0, 0, 1), (2, 1, 0, 1, 1)]


def run_manual(pool, pe, members, ids, decodes):
    """Prefill `ids` then `decodes` greedy decode steps on group `members`: every step's
    logits and the greedy tokens."""
    pages = pe.alloc.group(members, len(members))
    runner = pe.new_engine(GroupShape.tp_group(members)).runner
    seq = Sequence("x", list(ids), RequestSpec(GREEDY))
    seq.pages = pages.allocate(pages.pages_for(len(ids) + decodes))
    logits, start, q_len = [], 0, len(ids)
    for _ in range(decodes + 1):
        pool.launch_step(members, runner.prepare([Scheduled(seq, start, q_len)]))
        logits.append(pool.collect_step(members)[0])
        seq.output_ids.append(int(logits[-1].argmax()))
        start, q_len = seq.total_len - 1, 1
    pages.release(seq.pages)
    return logits, seq.output_ids


@pytest.mark.e2e
def test_logits_at_replicated_tp4_equal_tp1_and_hf(pool, tiny):
    hf, cfg = tiny
    ids = random_prompt(cfg, 13, seed=3)
    pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP1)
    ref, ref_tokens = run_manual(pool, pe, (0,), ids, 4)
    with torch.no_grad():
        hf_logits = hf(torch.tensor([ids + ref_tokens[:-1]])).logits[0, len(ids) - 1 :]
    assert (torch.stack(ref) - hf_logits).abs().max().item() <= 1e-4
    assert ref_tokens == hf_greedy(hf, ids, 5)
    for members in ((0, 1), (0, 1, 2, 3)):
        logits, tokens = run_manual(pool, pe, members, ids, 4)
        assert tokens == ref_tokens, f"TP {len(members)}"
        diff = (torch.stack(logits) - torch.stack(ref)).abs().max().item()
        assert diff <= 1e-4, f"TP {len(members)}: {diff}"


@pytest.mark.e2e
def test_tp4_engine_greedy_equals_hf(pool, tiny):
    hf, cfg = tiny
    ps = prompts(cfg, 3)
    pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP4)
    for i, p in enumerate(ps):
        pe.add_request(f"r{i}", p, RequestSpec(GREEDY))
    out = drain(pe, {})
    assert out == {f"r{i}": hf_greedy(hf, p, GREEDY.max_tokens) for i, p in enumerate(ps)}


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["pipelined", "per_page"])
def test_migration_through_replicated_tp4_keeps_tokens_and_moves_exact_bytes(pool, tiny, mode):
    hf, cfg = tiny
    ps = prompts(cfg)
    single = build_engine(
        cfg, hf.state_dict().items(), EngineConfig(kv_cache_bytes=4 << 20, page_tokens=4)
    )
    for i, p in enumerate(ps):
        single.add_request(f"r{i}", p, RequestSpec(GREEDY))
    ref = drain(single, {})  # the no-switch run
    pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP1)
    for i, p in enumerate(ps):
        pe.add_request(f"r{i}", p, RequestSpec(GREEDY))
    out: dict[str, list[int]] = {}
    head_token_bytes = cfg.num_layers * 2 * cfg.head_dim * 4  # one head of one token, K and V
    for plan in (TP4, TP2, TP1):
        drain(pe, out, steps=3)
        computed = sum(s.num_computed for e in pe.engines.values() for s in e.sequences())
        tp = plan[0].tp
        report = pe.reconfigure(plan, mode)
        assert report.ok, report.error
        assert pe.groups == plan
        assert report.recomputed_requests == 0 and report.moved_requests > 0
        # Each destination rank receives (or copies locally) the heads it holds, once:
        # TP 1 → 4 moves twice the KV (each head to both replicas), 4 → 2 and 2 → 1 once.
        assert report.bytes_moved == computed * tp * cfg.kv_heads_per_rank(tp) * head_token_bytes
        assert_pages_consistent(pe)
    drain(pe, out)
    assert out == ref


@pytest.mark.e2e
def test_prompt_logprobs_on_a_tp4_group_are_the_models(pool, tiny):
    """Echo with logprobs through the device pool: the prompt's scoring rows come back from
    the group's sampling rank with the step's logits (TP 4, replicated KV heads)."""
    hf, cfg = tiny
    prompt = random_prompt(cfg, 30, seed=7)
    p = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=1)
    pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP4)
    pe.add_request("s", prompt, RequestSpec(p))
    outs = []
    while pe.has_unfinished():
        outs += pe.step()
    got = next(o.prompt_logprobs for o in outs if o.prompt_logprobs is not None)
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)
    assert [lp.top[0][0] for lp in got] == want[:-1].argmax(-1).tolist()
    assert [lp.logprob for lp in got] == pytest.approx(
        [float(want[j, prompt[j + 1]]) for j in range(len(prompt) - 1)], abs=1e-4
    )
