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

from nitsum.engine.build import EngineConfig, build_engine  # noqa: E402
from nitsum.engine.sequence import Sequence  # noqa: E402
from nitsum.pool.local import local_engine  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from test_model_logits import all_logits  # noqa: E402
from tiny import POOL_ECFG, drain, make_tiny, random_prompt  # noqa: E402

FUSED = EngineConfig(kv_cache_bytes=1 << 20, page_tokens=4, fused_ops=True)


@pytest.mark.parametrize("variant", ["llama-gqa", "qwen2-bias", "llama3-rope"])
def test_fused_chunks_and_decodes_match_transformers(variant):
    """Prefill chunks over cached context and single-token decodes: every row's logits within
    1e-4 of HF's (fp32), so the rotary kernel wrote K/V where attention reads it."""
    hf, cfg = make_tiny(variant)
    engine = build_engine(cfg, hf.state_dict().items(), FUSED)
    assert engine.runner.model.fused
    ids = torch.randint(0, cfg.vocab_size, (30,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    seq = Sequence("r", ids[:26].tolist(), SamplingParams())
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
    ecfg = replace(POOL_ECFG, token_budget=16, max_context=96)
    prompts = [random_prompt(cfg, n, seed=n) for n in (5, 40, 9)]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    def run(engine):
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, greedy)
        return drain(engine)

    torch_ids = run(local_engine(cfg, hf.state_dict().items(), ecfg))
    fused = local_engine(cfg, hf.state_dict().items(), replace(ecfg, fused_ops=True))
    assert fused.pool.runner.model.fused
    assert run(fused) == torch_ids
    assert all(len(t) == 6 for t in torch_ids.values())
