"""Write a random-weight Llama-shaped HF model directory, fast: each tensor is drawn directly
on the device in the target dtype and written as safetensors (no transformers model is built,
which for a 7.4B-parameter model costs minutes of CPU init).

The vocabulary is Llama-3's 128,256 by default. Tokenizer files (`--tokenizer-dir`:
tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json) go beside
the weights, so `nitsum serve` can tokenize for it; a tokenizer smaller than `--vocab`
(SmolLM2's 49,152) is widened to it (scripts/wide_tokenizer.py), so every id the model can
be prompted with or can generate is one the router takes and detokenizes.

    python scripts/random_model.py OUT --layers 32 --hidden 4096 --device cuda \\
        --tokenizer-dir .gpu_carry/tokenizer
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from wide_tokenizer import LLAMA3_VOCAB, widen_dir  # scripts/ is on the path

INIT_STD = 0.02  # transformers' default initializer_range


def hf_config(layers: int, hidden: int, heads: int, kv_heads: int, vocab: int) -> dict:
    """An HF `LlamaForCausalLM` config.json of this shape (intermediate = 3.5 x hidden, as
    Llama-3-8B's 14336 / 4096)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 7 // 2,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def layer_shapes(cfg: dict, i: int) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of decoder layer `i`."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.o_proj.weight": (h, q),
        p + "mlp.gate_proj.weight": (inter, h),
        p + "mlp.up_proj.weight": (inter, h),
        p + "mlp.down_proj.weight": (h, inter),
    }


def draw(shapes: dict[str, tuple[int, ...]], device: str, dtype: torch.dtype, seed: int) -> dict:
    """Norm weights are ones, every other tensor N(0, INIT_STD); moved to the host for saving."""
    g = torch.Generator(device).manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, device=device, dtype=dtype)
        else:
            t = torch.randn(shape, device=device, dtype=dtype, generator=g).mul_(INIT_STD)
        out[name] = t.cpu()
    return out


def write_model(out: Path, cfg: dict, device: str, dtype: torch.dtype) -> int:
    """Write one safetensors shard per layer (plus one for the embedding, final norm and LM
    head), then config.json; returns the parameter count."""
    out.mkdir(parents=True, exist_ok=True)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    outer = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    n = cfg["num_hidden_layers"]
    groups = [outer] + [layer_shapes(cfg, i) for i in range(n)]
    params = 0
    for k, shapes in enumerate(groups):
        tensors = draw(shapes, device, dtype, seed=k)
        params += sum(t.numel() for t in tensors.values())
        save_file(tensors, str(out / f"model-{k:05d}-of-{len(groups):05d}.safetensors"))
    # NOTE: written last, so a directory with a config.json is a whole model.
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=LLAMA3_VOCAB, help="Llama-3's: 128256")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokenizer-dir", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.tokenizer_dir is not None:  # NOTE: first: a tokenizer wider than --vocab is refused
        widen_dir(args.tokenizer_dir, args.out, args.vocab)
    cfg = hf_config(args.layers, args.hidden, args.heads, args.kv_heads, args.vocab)
    params = write_model(args.out, cfg, args.device, getattr(torch, args.dtype))
    print(
        f"random model: {params / 1e9:.2f} B params, {args.dtype}, written to {args.out} in "
        f"{time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
