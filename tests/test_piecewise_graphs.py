"""Steps recorded piecewise (engine/piecewise.py): everything but attention per token bucket,
recorded at start-up, attention eager between the pieces. On CPU the pieces run eagerly over
the same static buffers and padding that CUDA graphs replay, so these tests check that path:
greedy tokens equal the eager engine's for mixed prefill + decode steps. On a GPU (DEV) the
same tests record and replay real CUDA graphs with the fused Triton kernels."""

import os
from dataclasses import replace

import pytest
import torch

from nitsum.engine.graphs import CaptureAfterStartup, DecodeGraphs
from nitsum.engine.piecewise import PiecewiseGraphs, token_buckets
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.engine.step_inputs import build_pipeline_inputs, build_step_inputs
from nitsum.pool.device_commands import Counters
from nitsum.pool.local import local_engine
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from shapes import tp
from tiny import POOL_ECFG, POOL_PAGES, drain, make_tiny, random_prompt, tiny_device_pool

DEV = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
# A small token budget: the 40-token prompt is chunked while the others decode.
ECFG = replace(POOL_ECFG, device=DEV, token_budget=24, max_context=96, decode_graphs=False)
PIECEWISE = replace(ECFG, piecewise_graphs=True)


def prompts(cfg, lengths=(5, 40, 9)):
    return [random_prompt(cfg, n, seed=n) for n in lengths]


def run(engine, ps, params=GREEDY):
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, RequestSpec(params))
    return drain(engine)


def eager_ids(hf, cfg, ps, params=GREEDY, ecfg=ECFG):
    return run(local_engine(cfg, hf.state_dict().items(), ecfg), ps, params)


def test_buckets_cover_the_token_budget():
    assert token_buckets(24) == (1, 2, 4, 8, 16, 32)
    assert token_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert token_buckets(4096) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # past: eager


@pytest.mark.parametrize("decode_graphs", [False, True])
def test_mixed_steps_give_eager_tokens(decode_graphs):
    """Every step piecewise (or, with decode recordings too, the steps those cannot run):
    the eager engine's greedy tokens; padding rows never touch a sequence's page."""
    hf, cfg = make_tiny("llama-gqa")
    ps = prompts(cfg)
    eager = eager_ids(hf, cfg, ps)
    engine = local_engine(
        cfg, hf.state_dict().items(), replace(PIECEWISE, decode_graphs=decode_graphs)
    )
    runner = engine.pool.runner
    pw = runner.piecewise
    assert pw.buckets == (1, 2, 4, 8, 16, 32)
    assert PiecewiseGraphs.captures >= len(pw.buckets) * (cfg.num_layers + 1)
    assert run(engine, ps) == eager
    steps = GREEDY.max_tokens + 1  # at least: the prefill chunks, then every decode
    if decode_graphs:
        assert runner.graphs.replays > 0 and 0 < pw.replays < steps
    else:
        assert pw.replays >= steps


def test_fused_piecewise_gives_torch_tokens():
    """The CUDA path's pieces (fused kernels, K/V written by the rotary kernel, padding rows'
    K/V to the scratch page) under Triton's interpreter: the torch engine's tokens."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and Triton's interpreter is off")
    hf, cfg = make_tiny("llama-gqa")
    ps = prompts(cfg, (5, 30))
    params = replace(GREEDY, max_tokens=5)
    eager = eager_ids(hf, cfg, ps, params)
    ecfg = replace(PIECEWISE, token_budget=16, fused_ops=True)
    engine = local_engine(cfg, hf.state_dict().items(), ecfg)
    runner = engine.pool.runner
    assert runner.model.fused and runner.piecewise.buckets[-1] == 16
    scratch = runner.pool.scratch_page
    runner.pool.storage[:, :, scratch] = 0  # (recording at start-up wrote it)
    assert run(engine, ps, params) == eager
    assert runner.piecewise.replays > 0
    # 16 + 15 + 5 tokens (budget 16): the third step pads 5 rows up to the bucket of 8.
    assert runner.pool.storage[:, :, scratch].abs().sum() > 0


def test_sp_pipeline_and_oversized_steps_do_not_fit():
    """SP steps, a pipeline's micro-batches and steps past the largest bucket run eagerly."""
    hf, cfg = make_tiny("llama-gqa")
    engine = local_engine(cfg, hf.state_dict().items(), PIECEWISE)
    pw = engine.pool.runner.piecewise
    seqs = [Sequence(f"s{i}", random_prompt(cfg, 10, i), RequestSpec(GREEDY)) for i in range(4)]
    for s in seqs:
        s.pages = list(range(8 * int(s.request_id[1:]), 8 * int(s.request_id[1:]) + 8))
    batch = [Scheduled(s, 0, 10) for s in seqs[:2]]
    assert pw.fits(build_step_inputs(batch, 4))
    assert not pw.fits(build_step_inputs(batch, 4, sequence_parallel=True))
    assert not pw.fits(build_pipeline_inputs(batch, 4, stage_tp=1, micro_batches=2))
    big = [Scheduled(s, 0, 10) for s in seqs]  # 40 tokens > 32
    assert not pw.fits(build_step_inputs(big, 4))


def test_recording_after_startup_is_refused(monkeypatch):
    hf, cfg = make_tiny("llama-gqa")
    engine = local_engine(cfg, hf.state_dict().items(), PIECEWISE)
    runner = engine.pool.runner
    monkeypatch.setattr(DecodeGraphs, "_frozen", True)
    with pytest.raises(CaptureAfterStartup):
        PiecewiseGraphs(runner.model, runner.ctx, runner.pool)


def test_tp2_group_replays_pieces_with_their_all_reduces():
    """Two device processes at TP 2: pieces record per context at start-up and replay (their
    all-reduces inside) for mixed steps; the eager engine's tokens."""
    tiny = make_tiny("llama-gqa")
    hf, cfg = tiny
    ps = prompts(cfg)
    eager = eager_ids(hf, cfg, ps, ecfg=replace(ECFG, device="cpu"))
    ecfg = replace(PIECEWISE, device="cpu")  # two device processes: CPU (gloo) everywhere
    with tiny_device_pool(tiny, ecfg, devices=2, levels=(1, 2)) as pool:
        pe = PoolEngine(pool, cfg, ecfg, POOL_PAGES, [tp(0, 1)])
        out = run(pe, ps)
        stats = [pool.call(d, Counters()) for d in range(2)]
    assert out == eager
    assert all(s["piecewise_replays"] > 0 for s in stats)
