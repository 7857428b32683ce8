"""Shift parallelism on CPU devices (gloo): SP forward against TP-1 logits, shifting between SP
and TP mid-decode, the KV SP writes against TP's, and fewer tokens than ranks."""

import pytest
import torch

from device_probes import kv_slots
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.parallel.shard import HeadRange
from nitsum.parallel.shift import ShiftRule, crossover
from nitsum.parallel.topology import GroupShape
from nitsum.parallel.ulysses import TokenSplit, head_rows_by_rank
from nitsum.pool.device_commands import Counters, Probe
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.device_proc import ModelSource
from nitsum.pool.pool_engine import PoolEngine
from nitsum.profiling.measure import shift_threshold
from nitsum.sampling import SamplingParams
from shapes import tp
from tiny import POOL_ECFG, POOL_PAGES, assert_last_logits, hf_greedy, make_tiny, random_prompt

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
ALWAYS_SP, NEVER_SP = ShiftRule(threshold=0), ShiftRule(threshold=None)
ALL = (0, 1, 2, 3)


@pytest.fixture(scope="module", params=["llama-gqa", "llama-kv2"])
def tiny_pool(request):
    """(hf model, cfg, 4-device pool): 4 KV heads (SP 2 and 4 own whole groups) and 2 KV heads
    (SP 4 replicates each KV head on two ranks)."""
    hf, cfg = make_tiny(request.param)
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(4, source, POOL_ECFG, POOL_PAGES, levels=(1, 2, 4)) as pool:
        yield hf, cfg, pool


def engine(pool, cfg, groups, shift):
    ecfg = EngineConfig(**{**vars(POOL_ECFG), "shift": shift})
    return PoolEngine(pool, cfg, ecfg, POOL_PAGES, [GroupShape.tp_group(g) for g in groups])


def one_step(pe, group, items):
    """Run one step of `items` = [(seq, start, q_len)] on `group`: its logits and inputs."""
    pages = pe.alloc.group(group, len(group))
    for seq, _, _ in items:
        if not seq.pages:
            seq.pages = pages.allocate(pages.pages_for(seq.total_len))
    inputs = pe.engines[GroupShape.tp_group(group)].runner.prepare([Scheduled(*it) for it in items])
    pe.pool.launch_step(group, inputs)
    return pe.pool.collect_step(group), inputs


@pytest.mark.e2e
@pytest.mark.parametrize("group", [(0, 1), (0, 1, 2, 3)])
def test_sp_logits_equal_tp1(tiny_pool, group):
    """Prefill of two prompts in one step, then one decode step of both: each sampled row's
    logits equal HF's within 1e-4."""
    hf, cfg, pool = tiny_pool
    pe = engine(pool, cfg, [group], ALWAYS_SP)
    a, b = random_prompt(cfg, 13, 1), random_prompt(cfg, 6, 2)
    sa, sb = Sequence("a", a, RequestSpec(GREEDY)), Sequence("b", b, RequestSpec(GREEDY))
    pages = pe.alloc.group(group, len(group))
    for seq in (sa, sb):  # room for the decode token too
        seq.pages = pages.allocate(pages.pages_for(seq.total_len + 1))
    before = pool.call(0, Counters())
    logits, inputs = one_step(pe, group, [(sa, 0, len(a)), (sb, 0, len(b))])
    assert inputs.sequence_parallel
    # The SP path ran on the devices: two all-to-alls per layer, no all-reduce.
    after = pool.call(0, Counters())
    assert after["all_to_all"] - before["all_to_all"] == 2 * cfg.num_layers
    assert after["all_reduce"] == before["all_reduce"]
    assert_last_logits(hf, logits, [a, b])
    # Decode step over the cached prefix: 2 tokens for 2 or 4 ranks (padding rows).
    sa.output_ids.append(7)
    sb.output_ids.append(9)
    logits, inputs = one_step(pe, group, [(sa, len(a), 1), (sb, len(b), 1)])
    assert inputs.sequence_parallel and len(inputs.input_ids) < len(group) + 1
    assert_last_logits(hf, logits, [a + [7], b + [9]])
    assert pe.counters["sp_steps"] == 2 and pe.counters["tp_steps"] == 0


@pytest.mark.e2e
def test_one_token_on_four_ranks(tiny_pool):
    """Fewer tokens than ranks: a 1-token step at SP 4 is still exact."""
    hf, cfg, pool = tiny_pool
    pe = engine(pool, cfg, [(0, 1, 2, 3)], ALWAYS_SP)
    ids = [5]
    logits, inputs = one_step(pe, (0, 1, 2, 3), [(Sequence("x", ids, RequestSpec(GREEDY)), 0, 1)])
    assert inputs.sequence_parallel and len(inputs.input_ids) == 1
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    assert (logits[0] - ref).abs().max().item() <= 1e-4


@pytest.mark.e2e
def test_shift_mid_decode_keeps_greedy_tokens(tiny_pool):
    """The rule flips SP → TP → SP between iterations of running requests: greedy tokens are
    HF's, and both modes ran."""
    hf, cfg, pool = tiny_pool
    ps = [random_prompt(cfg, 5 + 4 * i, 10 + i) for i in range(4)]
    pe = engine(pool, cfg, [(0, 1, 2, 3)], ALWAYS_SP)
    for i, p in enumerate(ps):
        pe.add_request(f"r{i}", p, RequestSpec(GREEDY))
    out: dict[str, list[int]] = {}
    step = 0
    before = pool.call(0, Counters())
    while pe.has_unfinished():
        # Two steps SP, two steps TP, ...: the KV written in one mode is read in the other.
        pe.engines[tp(0, 1, 2, 3)].runner.shift = ALWAYS_SP if step // 2 % 2 == 0 else NEVER_SP
        for o in pe.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        step += 1
    assert out == {f"r{i}": hf_greedy(hf, p, GREEDY.max_tokens) for i, p in enumerate(ps)}
    assert pe.counters["sp_steps"] >= 4 and pe.counters["tp_steps"] >= 4
    # Both modes ran on the devices: all-to-alls for SP steps, all-reduces for TP steps.
    after = pool.call(0, Counters())
    layers = cfg.num_layers
    assert after["all_to_all"] - before["all_to_all"] == 2 * layers * pe.counters["sp_steps"]
    assert after["all_reduce"] - before["all_reduce"] == 2 * layers * pe.counters["tp_steps"]


@pytest.mark.e2e
def test_sp_writes_the_kv_tp_writes(tiny_pool):
    """The same prompt prefilled in SP on devices (0, 1) and in TP on (2, 3), into the same page
    ids: each rank's pages hold the same KV (layout invariance). The first layer's K/V is
    bitwise equal (same inputs, same projection); deeper layers agree to float rounding (TP's
    all-reduce sums in another order)."""
    hf, cfg, pool = tiny_pool
    pe = engine(pool, cfg, [(0, 1), (2, 3)], ALWAYS_SP)
    ids = random_prompt(cfg, 21, 3)
    sp_seq, tp_seq = (
        Sequence("sp", ids, RequestSpec(GREEDY)),
        Sequence("tp", ids, RequestSpec(GREEDY)),
    )
    one_step(pe, (0, 1), [(sp_seq, 0, len(ids))])
    pe.engines[tp(2, 3)].runner.shift = NEVER_SP
    one_step(pe, (2, 3), [(tp_seq, 0, len(ids))])
    assert tp_seq.pages == sp_seq.pages  # both groups' allocators were fresh
    assert pe.counters["sp_steps"] == 1 and pe.counters["tp_steps"] == 1
    for sp_dev, tp_dev in ((0, 2), (1, 3)):
        local_heads = HeadRange.of(cfg, 2, 0).kv_heads
        sp_kv = pool.call(sp_dev, Probe(kv_slots, (sp_seq.pages, len(ids), local_heads)))
        tp_kv = pool.call(tp_dev, Probe(kv_slots, (tp_seq.pages, len(ids), local_heads)))
        assert sp_kv.abs().sum() > 0
        assert torch.equal(sp_kv[0], tp_kv[0])
        assert torch.allclose(sp_kv, tp_kv, atol=1e-5)


@pytest.mark.e2e
def test_sp_writes_the_kv_tp_writes_on_four_ranks(tiny_pool):
    """The same at 4 ranks (for the 2-KV-head model a replicated layout: each KV head on two
    ranks): SP, then TP into the same pages; every rank's K/V agree."""
    hf, cfg, pool = tiny_pool
    pe = engine(pool, cfg, [ALL], ALWAYS_SP)
    ids = random_prompt(cfg, 17, 4)
    seq = Sequence("x", ids, RequestSpec(GREEDY))
    one_step(pe, ALL, [(seq, 0, len(ids))])
    local_heads = HeadRange.of(cfg, 4, 0).kv_heads
    sp_kv = [pool.call(d, Probe(kv_slots, (seq.pages, len(ids), local_heads))) for d in ALL]
    pe.engines[GroupShape.tp_group(ALL)].runner.shift = NEVER_SP
    one_step(
        pe, ALL, [(Sequence("y", ids, RequestSpec(GREEDY), pages=list(seq.pages)), 0, len(ids))]
    )
    assert pe.counters["sp_steps"] == 1 and pe.counters["tp_steps"] == 1
    for d in ALL:
        tp_kv = pool.call(d, Probe(kv_slots, (seq.pages, len(ids), local_heads)))
        assert sp_kv[d].abs().sum() > 0
        assert torch.equal(sp_kv[d][0], tp_kv[0])
        assert torch.allclose(sp_kv[d], tp_kv, atol=1e-5)


def test_token_split_and_head_rows():
    split = TokenSplit(5, 4)
    assert (split.chunk, split.padded) == (2, 8)
    x = torch.arange(5)
    assert split.take(x, 0).tolist() == [0, 1] and split.take(x, 2).tolist() == [4, 0]
    assert split.take(x, 3).tolist() == [0, 0]
    _, gqa = make_tiny("llama-gqa")
    assert head_rows_by_rank(gqa, 2) is None  # whole groups: a view
    _, kv2 = make_tiny("llama-kv2")  # 8 q heads, 2 KV heads: 4 q + k + v rows per group
    rows = head_rows_by_rank(kv2, 4).view(4, -1).tolist()
    # rank 1: q heads 2, 3 of group 0, then group 0's k (row 4) and v (row 5)
    assert rows == [[0, 1, 4, 5], [2, 3, 4, 5], [6, 7, 10, 11], [8, 9, 10, 11]]


def test_shift_rule_and_crossover():
    rule = ShiftRule(threshold=64, by_size={4: 16})
    assert not rule.sequence_parallel(1, 10_000)
    assert not rule.sequence_parallel(2, 64) and rule.sequence_parallel(2, 65)
    assert rule.sequence_parallel(4, 17)
    assert not ShiftRule(threshold=None).sequence_parallel(4, 10_000)
    tp = {16: 1.0, 64: 2.0, 256: 8.0, 1024: 30.0}

    def fit(sp):
        return crossover([(n, tp[n], sp[n]) for n in tp])

    assert fit({16: 1.5, 64: 2.5, 256: 6.0, 1024: 20.0}) == 64
    assert fit({16: 1.5, 64: 2.5, 256: 9.0, 1024: 31.0}) is None
    assert fit({16: 0.5, 64: 1.0, 256: 6.0, 1024: 20.0}) == 0
    # One noisy point where TP won past the crossover does not move the threshold there.
    assert fit({16: 1.5, 64: 1.5, 256: 8.1, 1024: 20.0}) == 16
    # The profile's points: prefill by prompt tokens, decode by batch.
    prefill = [{"tokens": 256, "ms": 10.0}]
    decode = [{"batch": 4, "context": 128, "ms": 2.0}]
    sp_prefill = [{"tokens": 256, "ms": 5.0}]
    sp_decode = [{"batch": 4, "context": 128, "ms": 3.0}]
    assert shift_threshold(prefill, decode, sp_prefill, sp_decode) == 4
