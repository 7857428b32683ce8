"""Pipeline parallelism on 4 CPU devices (gloo): (tp, pp) groups' logits against HF, with
micro-batches in flight, and the layer / batch partitions."""

import pytest

from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.engine.step_inputs import build_pipeline_inputs, split_batch
from nitsum.kv.pages import tokens_per_page
from nitsum.parallel.pipeline import build_stage, stage_layers
from nitsum.pool.device_commands import Counters
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.device_proc import ModelSource
from nitsum.sampling import SamplingParams
from tiny import POOL_ECFG, POOL_PAGES, assert_last_logits, make_tiny, random_prompt

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
MEMBERS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def tiny_pool():
    """A 4-layer tiny Llama (4 KV heads) on 4 device processes: (1,2), (2,2), (1,4) exist."""
    hf, cfg = make_tiny("llama-deep")
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(4, source, POOL_ECFG, POOL_PAGES, levels=(1, 2, 4)) as pool:
        yield hf, cfg, pool


def pipeline_step(pool, cfg, members, stage_tp, seqs, starts, micro):
    """One pipeline step of `seqs` (from `starts` to their ends), pages 0.. in order."""
    tpp = tokens_per_page(POOL_ECFG.page_tokens, cfg.kv_split(stage_tp))
    batch = [Scheduled(s, st, s.total_len - st) for s, st in zip(seqs, starts, strict=True)]
    inputs = build_pipeline_inputs(batch, tpp, stage_tp, micro)
    pool.launch_step(members, inputs)
    return pool.collect_step(members), inputs


@pytest.mark.parametrize(
    "members,stage_tp",
    [((0, 1), 1), (MEMBERS, 2), (MEMBERS, 1)],
    ids=["tp1-pp2", "tp2-pp2", "tp1-pp4"],
)
def test_pipeline_logits_equal_tp1(tiny_pool, members, stage_tp):
    """Prefill of two prompts as two micro-batches, then a decode step of both: each sampled
    row equals HF's logits within 1e-4, and the stages handed activations on."""
    hf, cfg, pool = tiny_pool
    tpp = tokens_per_page(POOL_ECFG.page_tokens, cfg.kv_split(stage_tp))
    a, b = random_prompt(cfg, 11, 1), random_prompt(cfg, 6, 2)
    sa, sb = Sequence("a", a, RequestSpec(GREEDY)), Sequence("b", b, RequestSpec(GREEDY))
    sa.pages = list(range(0, 8))
    sb.pages = list(range(8, 16))
    assert 8 * tpp > len(a) + 1
    before = sum(pool.call(d, Counters())["p2p_sends"] for d in members)
    logits, inputs = pipeline_step(pool, cfg, members, stage_tp, [sa, sb], [0, 0], 2)
    assert len(inputs.micro) == 2
    stages = len(members) // stage_tp
    # Each non-last rank sent each micro-batch once.
    sent = sum(pool.call(d, Counters())["p2p_sends"] for d in members) - before
    assert sent == 2 * stage_tp * (stages - 1)
    assert_last_logits(hf, logits, [a, b])
    sa.output_ids.append(7)
    sb.output_ids.append(9)
    logits, _ = pipeline_step(pool, cfg, members, stage_tp, [sa, sb], [len(a), len(b)], 2)
    assert_last_logits(hf, logits, [a + [7], b + [9]])


def test_stage_layers_and_neighbours():
    assert [list(stage_layers(4, 2, s)) for s in range(2)] == [[0, 1], [2, 3]]
    assert [len(stage_layers(5, 2, s)) for s in range(2)] == [2, 3]
    with pytest.raises(ValueError):
        stage_layers(2, 4, 0)
    # (2, 2) on devices 4..7: stage 1's rank 1 is device 7; its previous stage's is device 5.
    stage = build_stage(4, 2, (4, 5, 6, 7), 7)
    assert (stage.index, stage.prev, stage.next, list(stage.layers)) == (1, 5, None, [2, 3])
    assert build_stage(4, 4, MEMBERS, 0) is None  # one stage: a TP group


def test_split_batch_keeps_order_and_balances_tokens():
    class Item:
        def __init__(self, q_len):
            self.q_len = q_len

    def split(qs, parts):
        return [[x.q_len for x in part] for part in split_batch([Item(q) for q in qs], parts)]

    assert split([1, 1, 1, 1], 2) == [[1, 1], [1, 1]]
    assert split([1, 1, 1, 1, 1, 1, 1, 1], 4) == [[1, 1]] * 4
    assert split([1, 100], 2) == [[1], [100]]
    assert split([1], 4) == [[1]]  # never an empty micro-batch
    assert split([64, 1, 1, 1], 2) == [[64], [1, 1, 1]]
