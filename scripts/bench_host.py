"""The engine's host time per step against the GPU step it must hide behind, in one run.

On a GPU the engine overlaps the host's work for step N+1 (scheduling, page bookkeeping,
step inputs, applying step N's tokens) with the device's step N (engine/overlap.py). That
hides the host only while its work is shorter than the device's step: past that the GPU
idles. This script measures the host's side alone: a one-layer, 64-wide random Llama on the
CPU (its forward costs next to nothing and is timed and subtracted) served at the GPU's step
limits (token budget 8,192, 256 sequences, a KV pool of 40k pages: every scenario fits) with
overlapped steps and the prefix cache on, as `nitsum serve` runs.
Per scenario it prints the host's ms per step and, beside it, the GPU step of the same batch
in the 8B H100 profile (`profiles/h100-llama3-8b-analytic.json`, `BindingModel`), and their
ratio. The host's work must stay well under 1.0x of the GPU's step (≤ 0.5x leaves room for a
slower host core and the Python of the model's forward, which this does not count).

Scenarios: decode at batch 1 / 64 / 256 with 128- and 2,048-token prompts; a mixed step
(2,000-token prompts arriving while 64 sequences decode).

    python scripts/bench_host.py [--scenarios decode-256 ...] [--steps 48]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from model_shapes import random_llama  # scripts/ is on the path
from nitsum import _core
from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.runner import ModelRunner
from nitsum.engine.sequence import Sequence
from nitsum.pool.local import local_engine
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams

PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "h100-llama3-8b-analytic.json"
# (decoding sequences, prompt tokens, prompts arriving per step) of each scenario.
SCENARIOS: dict[str, tuple[int, int, int]] = {
    "decode-1": (1, 128, 0),
    "decode-64": (64, 128, 0),
    "decode-256": (256, 128, 0),
    "decode-64-ctx2k": (64, 2048, 0),
    "decode-256-ctx2k": (256, 2048, 0),
    "mixed-64+prefill": (64, 128, 2),
}
PAGES = 40960


class ForwardClock:
    """Seconds spent in `ModelRunner.forward` (the model, not the host's engine work)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._orig: Callable[..., torch.Tensor] = ModelRunner.forward

    def __enter__(self) -> ForwardClock:
        orig = self._orig

        def timed(runner: ModelRunner, inputs: object) -> torch.Tensor:
            t = time.perf_counter()
            out = orig(runner, inputs)  # type: ignore[arg-type]
            self.seconds += time.perf_counter() - t
            return out

        ModelRunner.forward = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        ModelRunner.forward = self._orig  # type: ignore[method-assign]


def make_engine() -> tuple[PoolEngine, int]:
    """The near-free model at the GPU's step limits; (engine, vocab size)."""
    hf, hf_cfg = random_llama(
        "tiny",
        "cpu",
        torch.float32,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
    )
    cfg = ModelConfig.from_hf(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    page_bytes = 16 * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * cfg.num_layers
    ecfg = EngineConfig(
        device="cpu",
        kv_cache_bytes=PAGES * page_bytes,
        max_batch=256,
        token_budget=8192,
        max_context=4096,
        decode_graphs=False,
        overlap=True,
    )
    return local_engine(cfg, list(hf.state_dict().items()), ecfg), cfg.vocab_size


def run(
    engine: PoolEngine, vocab: int, scenario: tuple[int, int, int], steps: int
) -> tuple[float, float, float]:
    """(host ms per step, decoding sequences, prompt tokens per step) over `steps` steps
    once the decoding sequences are all running."""
    batch, prompt, arriving = scenario
    g = torch.Generator().manual_seed(batch * 7 + prompt)
    tag = time.monotonic_ns()
    long = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    for i in range(batch):
        ids = torch.randint(0, vocab, (prompt,), generator=g).tolist()
        engine.add_request(f"{tag}-d{i}", ids, RequestSpec(long))
    while any(s.num_computed < len(s.prompt_ids) for s in _seqs(engine)):
        engine.step()
    short = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    with ForwardClock() as clock:
        t0 = time.perf_counter()
        for k in range(steps):
            for j in range(arriving):
                ids = torch.randint(0, vocab, (2000,), generator=g).tolist()
                engine.add_request(f"{tag}-p{k}-{j}", ids, RequestSpec(short))
            engine.step()
        wall = time.perf_counter() - t0
    for seq in _seqs(engine):
        engine.abort(seq.request_id)
    while engine.has_unfinished():
        engine.step()
    return (wall - clock.seconds) / steps * 1e3, batch, arriving * 2000


def _seqs(engine: PoolEngine) -> list[Sequence]:
    """The sequences of the engine's one group."""
    (group,) = engine.engines.values()
    return list(group.seqs.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine, vocab = make_engine()
    gpu = _core.BindingModel(_core.Profile(PROFILE.read_text()))
    run(engine, vocab, (4, 64, 0), 4)  # warm-up
    print(f"host time per step (CPU, torch {torch.__version__}) vs the 8B H100 profile's step")
    for name in args.scenarios:
        scenario = SCENARIOS[name]
        host_ms, decoding, prefill = run(engine, vocab, scenario, args.steps)
        gpu_ms = gpu.iteration_ms(1, int(decoding), float(scenario[1]), int(prefill))
        print(
            f"[host] {name:>18}: host {host_ms:7.2f} ms/step, GPU step {gpu_ms:6.2f} ms, "
            f"host/GPU {host_ms / gpu_ms:5.2f}x ({'ok' if host_ms <= 0.5 * gpu_ms else 'OVER'})"
        )
    print(json.dumps({"profile": PROFILE.name}))


if __name__ == "__main__":
    main()
