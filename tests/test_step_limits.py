"""The per-step token budget and batch cap follow the device (vLLM's 8192 tokens / 256
sequences on a GPU, the CPU defaults unchanged), flags override them, and a GPU's recorded
decode steps cover its whole batch."""

from __future__ import annotations

from nitsum import serve, serve_commands
from nitsum.engine.engine_config import EngineConfig, default_step_limits
from nitsum.engine.graphs import DEFAULT_BUCKETS, decode_buckets
from nitsum.worker.__main__ import build_parser as worker_parser
from nitsum.worker.__main__ import engine_config


def test_defaults_by_device():
    assert default_step_limits("cpu") == (512, 64)
    assert default_step_limits("cuda") == default_step_limits("cuda:3") == (8192, 256)
    cpu, gpu = EngineConfig(), EngineConfig(device="cuda:1")
    assert (cpu.token_budget, cpu.max_batch) == (512, 64)
    assert (gpu.token_budget, gpu.max_batch) == (8192, 256)
    mine = EngineConfig(device="cuda", token_budget=2048, max_batch=32)
    assert (mine.token_budget, mine.max_batch) == (2048, 32)


def test_worker_flags_override_the_device_default():
    base = ["--model", "m", "--router", "tcp://x:1", "--worker-id", "0"]
    ecfg = engine_config(worker_parser().parse_args([*base, "--device", "cuda:0"]))
    assert (ecfg.token_budget, ecfg.max_batch) == (8192, 256)
    args = [*base, "--device", "cuda:0", "--token-budget", "4096", "--max-batch", "128"]
    ecfg = engine_config(worker_parser().parse_args(args))
    assert (ecfg.token_budget, ecfg.max_batch) == (4096, 128)
    ecfg = engine_config(worker_parser().parse_args(base))
    assert (ecfg.token_budget, ecfg.max_batch) == (512, 64)


def test_a_cuda_worker_compiles_its_attention_kernels_at_start_up():
    base = ["--model", "m", "--router", "tcp://x:1", "--worker-id", "0"]
    assert engine_config(worker_parser().parse_args([*base, "--device", "cuda:0"])).warm_kernels
    assert not engine_config(worker_parser().parse_args(base)).warm_kernels
    assert not EngineConfig(device="cuda").warm_kernels  # offline engines compile lazily


def test_serve_passes_only_the_limits_it_was_given():
    args = serve.build_parser().parse_args(["--device", "cuda"])
    assert serve_commands.step_limit_flags(args) == []
    args = serve.build_parser().parse_args(["--token-budget", "1024", "--max-batch", "8"])
    assert serve_commands.step_limit_flags(args) == ["--max-batch", "8", "--token-budget", "1024"]


def test_decode_buckets_cover_the_batch_cap():
    assert decode_buckets(64) == DEFAULT_BUCKETS
    assert decode_buckets(8) == DEFAULT_BUCKETS  # never fewer than the defaults
    assert decode_buckets(256) == (*DEFAULT_BUCKETS, 128, 256)
    assert decode_buckets(200)[-1] == 256
