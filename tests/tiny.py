"""Tiny random HF models used as references across tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.kv.cache import KVCache
from nitsum.parallel.topology import GroupShape
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.device_proc import ModelSource

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=256,
)

VARIANTS = {
    "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(**BASE)),
    "llama-tied": lambda: LlamaForCausalLM(LlamaConfig(**BASE, tie_word_embeddings=True)),
    "llama3-rope": lambda: LlamaForCausalLM(
        LlamaConfig(
            **BASE,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
    ),
    "qwen2-bias": lambda: Qwen2ForCausalLM(Qwen2Config(**BASE)),
    "mha": lambda: LlamaForCausalLM(LlamaConfig(**{**BASE, "num_key_value_heads": 8})),
    # 2 KV heads for 8 query heads: TP 4 replicates each KV head on 2 ranks.
    "llama-kv2": lambda: LlamaForCausalLM(LlamaConfig(**{**BASE, "num_key_value_heads": 2})),
    "qwen2-kv2": lambda: Qwen2ForCausalLM(Qwen2Config(**{**BASE, "num_key_value_heads": 2})),
    # 4 layers: pipelines of 2 and 4 stages
    "llama-deep": lambda: LlamaForCausalLM(LlamaConfig(**{**BASE, "num_hidden_layers": 4})),
    # room for an 8k-token prompt (the long-prompt fairness test)
    "llama-long": lambda: LlamaForCausalLM(
        LlamaConfig(**{**BASE, "max_position_embeddings": 8448})
    ),
}


def make_tiny(variant: str = "llama-gqa", seed: int = 0):
    """A random HF model (fp32, eval) and our ModelConfig for it."""
    torch.manual_seed(seed)
    model = VARIANTS[variant]().eval()
    # Random init leaves biases at zero; make them matter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    cfg = ModelConfig.from_hf(model.config.to_dict() | {"architectures": [type(model).__name__]})
    return model, cfg


def random_llama(
    hidden: int, layers: int, kv_heads: int = 4, vocab: int = 512, max_positions: int = 4096
) -> tuple[torch.nn.Module, ModelConfig]:
    """A random Llama of 8 heads sized for benchmarks (HF model in eval mode, our config);
    the MLP is 11/4 of the hidden size, as Llama's."""
    torch.manual_seed(0)
    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=hidden * 11 // 4,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=kv_heads,
            max_position_embeddings=max_positions,
        )
    ).eval()
    cfg = hf.config.to_dict() | {"architectures": ["LlamaForCausalLM"]}
    return hf, ModelConfig.from_hf(cfg)


def random_prompt(cfg: ModelConfig, n: int, seed: int) -> list[int]:
    """`n` random token ids of `cfg`'s vocabulary (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()


def kv_bytes(cfg: ModelConfig, pages: int, page_tokens: int = 4) -> int:
    """A KV budget of exactly `pages` pages (fp32, all layers, K and V)."""
    return pages * KVCache.page_bytes_of(cfg, page_tokens, torch.float32)


def hf_greedy(hf: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    """Transformers' greedy continuation of `ids`: the reference tokens."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(ids) :].tolist()


def assert_last_logits(hf: torch.nn.Module, logits: torch.Tensor, prompts: list[list[int]]):
    """Row i of `logits` is HF's logits after `prompts[i]` (within 1e-4, fp32)."""
    with torch.no_grad():
        for row, ids in zip(logits, prompts, strict=True):
            ref = hf(torch.tensor([ids])).logits[0, -1]
            assert (row - ref).abs().max().item() <= 1e-4


def drain(engine: Any, out: dict[str, list[int]] | None = None, steps: int | None = None):
    """Step `engine` until it is done (or for `steps` steps), collecting every request's
    tokens into `out`."""
    out = {} if out is None else out
    n = 0
    while engine.has_unfinished() and (steps is None or n < steps):
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        n += 1
    return out


def run_to_completion(
    engine: Any, max_steps: int = 10_000
) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Step `engine` until every request finished (asserted within `max_steps`): each
    request's token ids and finish reason."""
    outs: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                reasons[o.request_id] = o.finish_reason
    assert not engine.has_unfinished(), "requests left after max_steps"
    return outs, reasons


def assert_pages_consistent(pe: Any) -> None:
    """Every device's allocator agrees with the pages its sequences and caches own."""
    for device, (used, owned) in pe.page_accounting().items():
        assert used == owned, f"device {device}: allocator and sequences disagree"


def run_arrivals(
    engine: Any, arrivals: dict[int, list[tuple[str, list[int], RequestSpec]]]
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Step `engine` to the end, adding `arrivals[step]` ((id, prompt, spec) of `add_request`)
    before that step; every request's tokens and the step it got its first token at."""
    out: dict[str, list[int]] = {}
    first: dict[str, int] = {}
    step = 0
    while engine.has_unfinished() or any(s >= step for s in arrivals):
        for rid, ids, spec in arrivals.get(step, []):
            engine.add_request(rid, ids, spec)
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.new_token_ids:
                first.setdefault(o.request_id, step)
        step += 1
    return out, first


# A 4-device CPU pool of the "llama-gqa" tiny model (4 KV heads: TP 1/2/4), shared by the TP
# switching and host worker tests.
# Engine steps run eagerly and synchronously, on CUDA too: no recorded graphs (a replay calls
# neither a swapped-in attention nor a counted forward) and no overlapped steps.
EAGER_STEPS = dict(decode_graphs=False, piecewise_graphs=False, overlap=False)

POOL_DEVICES = 4
POOL_ECFG = EngineConfig(page_tokens=4, token_budget=64, tp_levels=(1, 2, 4))
POOL_PAGES = 256


@contextmanager
def tiny_device_pool(
    tiny: tuple,
    ecfg: EngineConfig = POOL_ECFG,
    devices: int = POOL_DEVICES,
    pages: int = POOL_PAGES,
    levels: tuple[int, ...] = (1, 2, 4),
) -> Iterator[DevicePool]:
    """Device processes for `tiny = make_tiny(...)`, stopped on exit."""
    hf, cfg = tiny
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(devices, source, ecfg, pages, levels=levels) as pool:
        yield pool


def layout_slices(cfg: ModelConfig, shapes: list[GroupShape]) -> dict[int, set[tuple[int, int]]]:
    """(device -> the (layer, KV head) slices it holds) in a layout of TP groups and pipelines
    (an independent count of what a 2-D migration must move: the slices a device gains)."""
    from nitsum.parallel.pipeline import stage_layers
    from nitsum.parallel.shard import kv_head_range

    out: dict[int, set[tuple[int, int]]] = {}
    for shape in shapes:
        tp, pp = shape.tp, shape.pp
        for i, d in enumerate(shape.members):
            layers = stage_layers(cfg.num_layers, pp, i // tp)
            heads = kv_head_range(cfg.num_kv_heads, tp, i % tp)
            out[d] = {(layer, h) for layer in layers for h in heads}
    return out
