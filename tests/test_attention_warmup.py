"""Start-up warm-up of the attention kernels (engine/attention_warmup.py): it launches every
compiled variant that the steps of a serving run launch, so none compiles mid-step. On CPU
through Triton's interpreter (the launches and their compile-time arguments are what is
checked; the interpreter compiles nothing)."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)

from nitsum.engine.attention_warmup import chunk_counts, warm_attention  # noqa: E402
from nitsum.engine.build import build_engine  # noqa: E402
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from nitsum_kernels import decode_attention_triton as dat  # noqa: E402
from nitsum_kernels import prefill_attention_triton as pat  # noqa: E402
from tiny import EAGER_STEPS, kv_bytes, random_llama, random_prompt  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Runtime ints: passed by keyword but no compile key (do_not_specialize).
RUNTIME = {"SPLITS"}


class Recorder:
    """Stands in for a jitted kernel: records each launch's compile-time keywords."""

    def __init__(self, kernel, seen: set) -> None:
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            key = frozenset((k, v) for k, v in kwargs.items() if k not in RUNTIME)
            self.seen.add((self.kernel, key))
            return launch(*args, **kwargs)

        return run


def record(monkeypatch) -> set:
    seen: set = set()
    for module, name in ((pat, "_prefill_kernel"), (dat, "_split_kernel"), (dat, "_merge_kernel")):
        monkeypatch.setattr(module, name, Recorder(getattr(module, name), seen))
    return seen


def test_the_warm_up_launches_every_variant_a_run_of_steps_does(monkeypatch):
    hf, cfg = random_llama(64, 1, kv_heads=2, vocab=128, max_positions=1024)
    ecfg = EngineConfig(
        device=DEV,
        kv_cache_bytes=kv_bytes(cfg, 512, 16),
        page_tokens=16,
        token_budget=160,
        max_batch=32,
        fused_ops=True,
        **EAGER_STEPS,
    )
    engine = build_engine(cfg, hf.state_dict().items(), ecfg)
    runs = record(monkeypatch)
    # Prompts of 1 to 300 tokens arriving while others decode (tiles of every size, decode
    # contexts of one split and of two), then a burst of 18 prompts (one step of 18 chunks).
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for i, n in enumerate([1, 3, 9, 20, 40, 70, 150, 300]):
        engine.add_request(f"r{i}", random_prompt(cfg, n, i), RequestSpec(params))
        engine.step()
    for i in range(18):  # a burst: one step of 18 chunks
        engine.add_request(f"b{i}", random_prompt(cfg, 2, 50 + i), RequestSpec(params))
    while engine.has_unfinished():
        engine.step()
    stepped = set(runs)
    assert len({k for k, _ in stepped}) == 3  # all three kernels ran
    runs.clear()
    runner = engine.runner
    assert runner.pool.scratch_page is None  # this engine records nothing: give it one
    with pytest.raises(ValueError, match="scratch page"):
        warm_attention(runner.model, runner.ctx, runner.pool, ecfg.max_batch)

    from nitsum.kv.cache import KVCache

    pool = KVCache(cfg, 8, 16, ecfg.dtype, DEV, scratch_page=True)
    calls = warm_attention(runner.model, runner.ctx, pool, ecfg.max_batch)
    warmed = set(runs)
    assert stepped <= warmed, stepped - warmed
    assert calls == 3 * 2 + 3  # fp32 tiles of 16, 32, 64 rows x 2 chunk vectors; decode 3
    assert any(("BLOCK_C", 256) in key for _, key in stepped)  # the burst's step


def test_chunk_counts_reach_every_vector_size_up_to_the_batch_cap():
    from nitsum_kernels.prefill_attention_triton import chunk_block

    for cap in (1, 16, 17, 256, 257, 300, 1000):
        sizes = {chunk_block(n) for n in chunk_counts(cap)}
        assert sizes >= {chunk_block(n) for n in range(1, cap + 1)}, cap
    assert chunk_counts(256) == [1, 17] and chunk_counts(600) == [1, 17, 257, 513]
