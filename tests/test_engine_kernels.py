"""The engine with the Triton attention kernels (nitsum_kernels) swapped in for the torch
reference, as on CUDA: greedy tokens equal transformers'. On CPU through Triton's interpreter
(conftest.py switches it on), on CUDA compiled. The kernels' own tests are kernels/tests/."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

from nitsum.engine.request_spec import RequestSpec  # noqa: E402
from nitsum_kernels.paged_attention_triton import paged_attention_triton  # noqa: E402


def test_engine_steps_with_the_kernels_match_transformers():
    """The engine with the Triton kernels in place of the torch reference (as on CUDA):
    prompts prefilled in chunks under a 16-token budget, beside other requests' decodes, in
    4-token pages (GQA 4:1); every request's greedy tokens equal transformers'."""
    from nitsum.engine.build import build_engine
    from nitsum.engine.engine_config import EngineConfig
    from nitsum.sampling import SamplingParams
    from tiny import hf_greedy, make_tiny, run_to_completion

    hf, cfg = make_tiny("llama-kv2")
    # NOTE: eager steps on the kernels' device (on CUDA, recorded steps would not call the
    # attention swapped in below).
    ecfg = EngineConfig(
        device=DEV,
        kv_cache_bytes=1 << 20,
        page_tokens=4,
        token_budget=16,
        decode_graphs=False,
        piecewise_graphs=False,
    )
    engine = build_engine(cfg, hf.state_dict().items(), ecfg)
    engine.runner.model.paged_attention = paged_attention_triton
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (5, 19, 40)]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, RequestSpec(greedy))
    outs, _ = run_to_completion(engine)
    assert outs == {f"r{i}": hf_greedy(hf, p, 6) for i, p in enumerate(prompts)}
