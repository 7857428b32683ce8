"""The model through the fused Triton path (the one CUDA runs: fused elementwise kernels,
K/V written by the rotary kernel, Triton attention), forced on CPU under Triton's
interpreter: the same logits as transformers and the same greedy tokens as the torch path."""

import os
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)

from nitsum.engine.build import build_engine  # noqa: E402
from nitsum.engine.device_build import build_model  # noqa: E402
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec  # noqa: E402
from nitsum.engine.scheduled import Scheduled  # noqa: E402
from nitsum.engine.sequence import Sequence  # noqa: E402
from nitsum.engine.step_inputs import build_step_inputs  # noqa: E402
from nitsum.kv.cache import KVCache  # noqa: E402
from nitsum.models.activations import Activations  # noqa: E402
from nitsum.parallel.context import TPContext  # noqa: E402
from nitsum.parallel.shard import HeadRange, shard_views  # noqa: E402
from nitsum.pool.local import local_engine  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from test_model_logits import all_logits  # noqa: E402
from tiny import POOL_ECFG, drain, make_tiny, random_prompt  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FUSED = EngineConfig(device=DEV, kv_cache_bytes=1 << 20, page_tokens=4, fused_ops=True)


@pytest.mark.parametrize("variant", ["llama-gqa", "qwen2-bias", "llama3-rope"])
def test_fused_chunks_and_decodes_match_transformers(variant):
    """Prefill chunks over cached context and single-token decodes: every row's logits within
    1e-4 of HF's (fp32), so the rotary kernel wrote K/V where attention reads it."""
    hf, cfg = make_tiny(variant)
    engine = build_engine(cfg, hf.state_dict().items(), FUSED)
    assert engine.runner.model.fused
    ids = torch.randint(0, cfg.vocab_size, (30,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].to(DEV)
    seq = Sequence("r", ids[:26].tolist(), RequestSpec(SamplingParams()))
    got = [all_logits(engine, seq, 0, 9), all_logits(engine, seq, 9, 17)]
    for pos in range(26, 30):
        seq.output_ids.append(int(ids[pos]))
        got.append(all_logits(engine, seq, pos, 1))
    ours = torch.cat(got)
    assert (ours - ref).abs().max().item() <= 1e-4


def test_fused_engine_gives_torch_greedy_tokens():
    """Mixed steps (a long prompt chunked by a small token budget while others decode): the
    fused engine's greedy ids equal the torch engine's."""
    hf, cfg = make_tiny("llama-gqa")
    ecfg = replace(POOL_ECFG, device=DEV, token_budget=16, max_context=96)
    prompts = [random_prompt(cfg, n, seed=n) for n in (5, 40, 9)]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    def run(engine):
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, RequestSpec(greedy))
        return drain(engine)

    torch_ids = run(local_engine(cfg, hf.state_dict().items(), replace(ecfg, fused_ops=False)))
    fused = local_engine(cfg, hf.state_dict().items(), replace(ecfg, fused_ops=True))
    assert fused.pool.runner.model.fused
    assert run(fused) == torch_ids
    assert all(len(t) == 6 for t in torch_ids.values())


def test_fused_qkv_of_a_replicated_kv_head_matches_torch():
    """TP 4 over 2 KV heads: each rank's q rows and its shared KV head's k/v rows are two
    views (`kv_proj`). The fused first piece (rotary writing K/V) and attention give every
    rank the torch path's attention output and cache contents."""
    hf, cfg = make_tiny("llama-kv2")
    ecfg = EngineConfig(device=DEV, page_tokens=4, tp_levels=(1, 2, 4))
    models = [build_model(cfg, hf.state_dict().items(), replace(ecfg, fused_ops=f)) for f in (0, 1)]
    seq = Sequence("r", random_prompt(cfg, 11, seed=3), RequestSpec(SamplingParams()))
    seq.pages = [5, 2]  # 8-token pages at TP 4 (each rank stores 1 of the 2 KV heads)
    for rank in range(4):
        heads = HeadRange.of(cfg, 4, rank)
        outs = []
        for model in models:
            ctx = TPContext(heads, shard_views(model.weights, 4, rank))
            assert ctx.layers[0].kv_proj is not None
            kv = KVCache(cfg, 8, 4, device=DEV)
            inputs = build_step_inputs([Scheduled(seq, 0, 11)], kv.tokens_per_page(4))
            meta = inputs.meta.to(DEV)
            act = Activations(torch.empty(0))
            ids, pos = inputs.input_ids.to(DEV), inputs.positions.to(DEV)
            model.begin(ctx, act, ids, pos, meta.slot_mapping, kv, 0)
            model.attention(ctx, act, 0, meta, kv)
            outs.append((act.o, kv.storage[0]))
        (o_t, kv_t), (o_f, kv_f) = outs
        assert models[1].fused and not models[0].fused
        torch.testing.assert_close(o_f, o_t, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv_f, kv_t, atol=1e-5, rtol=1e-5)
        assert kv_f.abs().sum() > 0
