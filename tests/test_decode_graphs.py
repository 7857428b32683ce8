"""Recorded decode steps (engine/graphs.py): per warm context and batch bucket, made at
start-up, selected (never recorded) by a TP switch. On CPU a recording runs eagerly over the
same static buffers and padding that a CUDA graph replays, so these tests check that path."""

from dataclasses import replace

import pytest
import torch

from nitsum.engine.graphs import DEFAULT_BUCKETS, CaptureAfterStartup, DecodeGraphs
from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.device_commands import Counters
from nitsum.pool.local import local_engine
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from shapes import layout, tp
from tiny import POOL_ECFG, POOL_PAGES, drain, make_tiny, tiny_device_pool

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
ECFG = replace(POOL_ECFG, decode_graphs=True, max_context=96)


def prompts(cfg, n):
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, cfg.vocab_size, (5 + 7 * i,), generator=g).tolist() for i in range(n)]


def run(engine, ps):
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, RequestSpec(GREEDY))
    return drain(engine)


@pytest.mark.parametrize("n", [1, 3, 6])
def test_recorded_decode_gives_eager_tokens(n):
    """Batches that fill a bucket exactly or leave padding rows: same greedy tokens as the
    eager engine; decode steps replayed; padding wrote only the scratch page."""
    hf, cfg = make_tiny("llama-gqa")
    ps = prompts(cfg, n)
    eager = run(local_engine(cfg, hf.state_dict().items(), replace(ECFG, decode_graphs=False)), ps)
    engine = local_engine(cfg, hf.state_dict().items(), ECFG)
    runner = engine.pool.runner
    scratch = runner.pool.scratch_page
    assert scratch == runner.pool.num_pages  # past every page the allocator hands out
    runner.pool.storage[:, :, scratch] = 0  # (recording at start-up wrote it)
    assert run(engine, ps) == eager
    assert runner.graphs.replays >= GREEDY.max_tokens - 1
    page = runner.pool.storage[:, :, scratch]
    assert (page.abs().sum() > 0) == (n not in runner.graphs.buckets)


def test_steps_a_recording_cannot_run_go_eager():
    """A step with a prefill, or more rows than the largest bucket, runs the eager forward."""
    hf, cfg = make_tiny("llama-gqa")
    engine = local_engine(cfg, hf.state_dict().items(), replace(ECFG, max_batch=8))
    graphs = engine.pool.runner.graphs
    graphs.buckets = graphs.buckets[:2]  # recordings for 1 and 2 rows only
    ps = prompts(cfg, 3)
    eager = run(local_engine(cfg, hf.state_dict().items(), replace(ECFG, decode_graphs=False)), ps)
    assert run(engine, ps) == eager
    # Three requests decode together to the end (same output length): none fits.
    assert graphs.replays == 0


@pytest.mark.e2e
def test_tp_switch_selects_recordings_and_never_records():
    """Every context of every device records at start-up; switches TP1 -> TP2 -> TP4 -> TP1
    mid-decode replay them (with their all-reduces) and record nothing; tokens match eager."""
    tiny = make_tiny("llama-gqa")
    hf, cfg = tiny
    ps = prompts(cfg, 6)
    eager = run(local_engine(cfg, hf.state_dict().items(), replace(ECFG, decode_graphs=False)), ps)
    with tiny_device_pool(tiny, ECFG) as pool:
        captures = [pool.call(d, Counters())["graph_captures"] for d in range(4)]
        # Contexts of TP 1, 2 and 4 on each device, a recording per bucket.
        assert captures == [3 * len(DEFAULT_BUCKETS)] * 4
        pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, [tp(d) for d in range(4)])
        for i, p in enumerate(ps):
            pe.add_request(f"r{i}", p, RequestSpec(GREEDY))
        out: dict[str, list[int]] = {}
        for plan in (
            layout((0, 1), (2, 3)),
            layout((0, 1, 2, 3)),
            layout((0,), (1,), (2,), (3,)),
        ):
            drain(pe, out, steps=3)
            assert pe.reconfigure(plan).ok
        drain(pe, out)
        stats = [pool.call(d, Counters()) for d in range(4)]
    assert out == eager
    assert [s["graph_captures"] for s in stats] == captures
    assert all(s["graph_replays"] > 0 for s in stats)


def test_recording_after_startup_is_refused(monkeypatch):
    hf, cfg = make_tiny("llama-gqa")
    engine = local_engine(cfg, hf.state_dict().items(), ECFG)
    runner = engine.pool.runner
    monkeypatch.setattr(DecodeGraphs, "_frozen", True)
    with pytest.raises(CaptureAfterStartup):
        DecodeGraphs(runner.model, runner.ctx, runner.pool, 96)
