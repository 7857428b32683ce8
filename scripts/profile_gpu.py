"""Measure a `nitsum-profile/1` GPU profile (TP 1) of a Llama-3.1-8B-shaped model.

Standalone: needs only torch and transformers (not the nitsum package), so it runs on a bare
GPU machine. The model is `LlamaForCausalLM` built from a `LlamaConfig` with Llama-3.1-8B's
shape and random weights (latency does not depend on weight values), bf16,
`attn_implementation="sdpa"`, eager PyTorch (no torch.compile), no materialized attention
mask (see `NoMask`).

- prefill: one forward over `n` prompt tokens, batch 1, no KV cache, logits for the last token
  only (`logits_to_keep=1`, as a server computes them);
- decode: one step of `b` sequences (one new token each) at context `c`, against a
  transformers `StaticCache` of length `c + 1` pre-filled with random K/V (no real prefill);
  the cache's write position is reset to `c` before every step, so every step is the same.

With `--graphs` each forward is also captured whole in a CUDA graph and its replays timed (the
cache reset is captured with it); the profile's `prefill`/`decode` then hold the graph replays
(GPU time without the host's launch gaps: an eager transformers decode step dispatches ~1,900
ATen ops from Python, and a slow host leaves the GPU idle between them), and `prefill_eager` /
`decode_eager` the eager numbers. Each point: `--warmup` untimed runs, then `--repeats` runs
each timed with CUDA events; the profile holds the median. Decode points whose KV cache would
not fit in 85% of the memory free after loading the weights are left out (as
`nitsum.profiling.analytic` leaves them out).

    python scripts/profile_gpu.py --graphs --repeats 15 --out measured-tp1.json
    python scripts/profile_gpu.py --layers 2 --tokens 64,512 --batches 1,8 --contexts 256  # smoke
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

# The grids of python/nitsum/profiling/analytic.py.
TOKENS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CONTEXTS = [256, 1024, 2048, 4096, 8192]


def llama31_8b_config(layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        attn_implementation="sdpa",
    )


class Timer:
    """Times `fn` with CUDA events (host clock on CPU); `setup` runs untimed before each call."""

    def __init__(self, device: torch.device, warmup: int, repeats: int):
        self.device, self.warmup, self.repeats = device, warmup, repeats

    def __call__(self, fn, setup=lambda: None) -> list[float]:
        for _ in range(self.warmup):
            setup()
            fn()
        times = []
        for _ in range(self.repeats):
            setup()
            if self.device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return times


def summary(times: list[float]) -> dict:
    s = sorted(times)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1]}


class SdpaProbe:
    """Records the shapes, mask and GQA mode of SDPA calls (to show what the timed step runs)."""

    def __enter__(self):
        self.orig = torch.nn.functional.scaled_dot_product_attention
        self.calls = []

        def spy(q, k, v, attn_mask=None, **kw):
            self.calls.append(
                {
                    "q": list(q.shape),
                    "k": list(k.shape),
                    "mask": attn_mask is not None,
                    **{x: kw[x] for x in ("is_causal", "enable_gqa") if x in kw},
                }
            )
            return self.orig(q, k, v, attn_mask=attn_mask, **kw)

        torch.nn.functional.scaled_dot_product_attention = spy
        return self

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = self.orig


class NoMask:
    """Run the model without a materialized attention mask.

    Neither step needs one: prefill is plainly causal over one unpadded sequence (SDPA's
    is_causal), and decode is one query token against a cache whose every slot is valid.
    transformers still builds a mask for a StaticCache at q_len 1, and for every forward while
    a CUDA graph is being captured; with a mask, transformers 5.17 repeats the 8 KV heads 4x
    per layer before SDPA. Without it SDPA runs GQA natively (enable_gqa), reads K/V once, and
    the eager and the captured forward run the same kernels.
    """

    def __enter__(self):
        import transformers.models.llama.modeling_llama as ml

        self.ml, self.orig = ml, ml.create_causal_mask
        ml.create_causal_mask = lambda *args, **kwargs: None
        return self

    def __exit__(self, *exc):
        self.ml.create_causal_mask = self.orig


def measure(fn, setup, timer, device, graphs: bool) -> dict:
    """Eager timing of `fn` (with untimed `setup`), then optionally its CUDA graph replays.

    The graph captures `setup` too (so each replay starts from the same state). Also records
    the first SDPA call each version makes.
    """
    with SdpaProbe() as probe:
        setup()
        fn()
    out = {"sdpa": probe.calls[0] if probe.calls else None}
    out["eager"] = summary(timer(fn, setup))
    if graphs and device.type == "cuda":
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    setup()
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with SdpaProbe() as probe, torch.cuda.graph(g):
                setup()
                fn()
            out["graph_sdpa"] = probe.calls[0] if probe.calls else None
            out["graph"] = summary(timer(g.replay))
            del g
        except Exception as e:  # noqa: BLE001 - report and go on with eager numbers only
            out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def measure_prefill(model, cfg, device, timer, n: int, graphs: bool, hf_mask: bool) -> dict:
    ids = torch.randint(0, cfg.vocab_size, (1, n), device=device)

    def step():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1)

    if hf_mask:
        return measure(step, lambda: None, timer, device, graphs)
    with NoMask():
        return measure(step, lambda: None, timer, device, graphs)


def filled_cache(cfg, device, dtype, b: int, c: int) -> StaticCache:
    """A StaticCache of length c + 1 for b sequences, positions [0, c) holding random K/V."""
    cache = StaticCache(config=cfg, max_cache_len=c + 1)
    kv = torch.randn(b, cfg.num_key_value_heads, c, cfg.head_dim, device=device, dtype=dtype)
    for layer in cache.layers[: cfg.num_hidden_layers]:
        layer.update(kv, kv)  # copies into the preallocated (b, kvh, c + 1, d) buffers
    return cache


def measure_decode(
    model, cfg, device, dtype, timer, b: int, c: int, graphs: bool, hf_mask: bool = False
) -> dict:
    cache = filled_cache(cfg, device, dtype, b, c)
    ids = torch.randint(0, cfg.vocab_size, (b, 1), device=device)
    pos = torch.full((b, 1), c, device=device, dtype=torch.long)
    lengths = [layer.cumulative_length for layer in cache.layers]

    def reset():
        for t in lengths:
            t.fill_(c)

    def step():
        return model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)

    if hf_mask:
        return measure(step, reset, timer, device, graphs)
    with NoMask():
        return measure(step, reset, timer, device, graphs)


def ceilings(device, timer) -> dict:
    """The two ceilings on this device: bf16 GEMM TFLOP/s and device-to-device copy GB/s."""
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    gemm_ms = statistics.median(timer(lambda: a @ b))
    x = torch.randn(1 << 30, device=device, dtype=torch.bfloat16)  # 2 GiB
    y = torch.empty_like(x)
    copy_ms = statistics.median(timer(lambda: y.copy_(x)))
    nbytes = 2 * x.numel() * x.element_size()  # read + write
    return {
        "gemm_bf16_8192_tflops": round(2 * n**3 / gemm_ms / 1e9, 1),
        "copy_read_plus_write_gbps": round(nbytes / copy_ms / 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=32, help="decoder layers (32 = Llama-3.1-8B)")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--graphs", action="store_true", help="also time decode as CUDA graph replays")
    p.add_argument(
        "--hf-mask",
        action="store_true",
        help="leave masking to transformers: it builds a mask for decode against a "
        "StaticCache and for any forward under CUDA graph capture (default: no mask)",
    )
    p.add_argument(
        "--kv-fraction",
        type=float,
        default=0.85,
        help="largest KV cache, as a fraction of the free memory after loading",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--device-name", help="profile's device field (default: from the GPU name)")
    p.add_argument("--out", help="profile JSON path (default: stdout)")
    args = p.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731

    device = torch.device(args.device)
    dtype = torch.bfloat16
    cfg = llama31_8b_config(args.layers)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    n_params = sum(x.numel() for x in model.parameters())
    weight_bytes = sum(x.numel() * x.element_size() for x in model.parameters())
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu_name = props.name
        free, total = torch.cuda.mem_get_info(device)
    else:
        gpu_name, free, total = platform.processor() or platform.machine(), 8e9, 8e9
    print(
        f"model: {n_params / 1e9:.3f}B params, {weight_bytes / 1e9:.2f} GB, built in "
        f"{time.perf_counter() - t0:.1f}s; device {gpu_name}; free {free / 1e9:.1f} of "
        f"{total / 1e9:.1f} GB; torch {torch.__version__}, transformers "
        f"{transformers.__version__}",
        flush=True,
    )
    kv_budget = args.kv_fraction * free

    timer = Timer(device, args.warmup, args.repeats)
    ceil = ceilings(device, timer) if device.type == "cuda" else {}
    print(f"ceilings: {ceil}", flush=True)

    # Per mode ("eager", "graph"): the schema's point lists; detail rows hold min/max too.
    points = {m: {"prefill": [], "decode": []} for m in ("eager", "graph")}
    detail, sdpa_calls, skipped, graph_errors = {"prefill": [], "decode": []}, {}, [], []

    def record(kind: str, key: dict, r: dict) -> str:
        row = dict(key)
        line = ""
        for mode in ("eager", "graph"):
            if mode not in r:
                continue
            t = r[mode]
            points[mode][kind].append({**key, "ms": round(t["median"], 4)})
            row.update({f"{mode}_{k}": round(v, 4) for k, v in t.items()})
            line += f"  {mode} median {t['median']:9.3f} (min {t['min']:8.3f}, max {t['max']:8.3f})"
        for mode, field in (("eager", "sdpa"), ("graph", "graph_sdpa")):
            if field in r and f"{kind}_{mode}" not in sdpa_calls:
                sdpa_calls[f"{kind}_{mode}"] = r[field]
                print(f"{kind} {mode} SDPA call: {r[field]}", flush=True)
        if "graph_error" in r:
            graph_errors.append({**key, "error": r["graph_error"]})
            line += f"  graph failed: {r['graph_error'][:160]}"
        detail[kind].append(row)
        return line

    with torch.inference_mode():
        for n in ints(args.tokens):
            r = measure_prefill(model, cfg, device, timer, n, args.graphs, args.hf_mask)
            print(f"prefill n={n:5d}:" + record("prefill", {"tokens": n}, r), flush=True)
        for c in ints(args.contexts):
            for b in ints(args.batches):
                if b * (c + 1) * kv_per_token > kv_budget:
                    skipped.append({"batch": b, "context": c})
                    continue
                try:
                    r = measure_decode(
                        model, cfg, device, dtype, timer, b, c, args.graphs, args.hf_mask
                    )
                except torch.OutOfMemoryError:
                    skipped.append({"batch": b, "context": c, "why": "out of memory"})
                    print(f"decode b={b} c={c}: out of memory, skipped", flush=True)
                    continue
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                key = {"batch": b, "context": c}
                print(f"decode b={b:3d} c={c:5d}:" + record("decode", key, r), flush=True)

    # The schema's prefill/decode: CUDA graph replays where every point has one, else eager.
    use = "graph" if args.graphs and not graph_errors and device.type == "cuda" else "eager"
    prefill, decode = points[use]["prefill"], points[use]["decode"]
    name = args.device_name or gpu_name.lower().replace("nvidia ", "").replace(" ", "-")
    mask_note = (
        "masking left to transformers (--hf-mask: it materializes a mask for decode against "
        "a StaticCache and for every forward under CUDA graph capture, and then repeats the 8 "
        "KV heads 4x before SDPA in transformers 5.17; eager prefill runs SDPA is_causal "
        "without a mask)"
        if args.hf_mask
        else "no materialized attention mask (SDPA with is_causal for prefill; decode against "
        "a cache whose every slot is valid; enable_gqa, so the 8 KV heads are read once)"
    )
    method = (
        f"Measured with scripts/profile_gpu.py on one {gpu_name}: transformers "
        f"{transformers.__version__} LlamaForCausalLM with Llama-3.1-8B's shape "
        f"({cfg.num_hidden_layers} layers, hidden 4096, 32 heads, 8 KV heads, intermediate "
        "14336, vocab 128256), random weights, bf16, attn_implementation=sdpa, no "
        f"torch.compile, {mask_note}. prefill: one forward over `tokens` "
        "prompt tokens, batch 1, no KV cache, logits for the last token only. decode: one "
        "step of `batch` sequences at `context` tokens each against a transformers "
        "StaticCache of length context+1 "
        "pre-filled with random K/V, logits for every sequence. Each point: "
        f"{args.warmup} warm-up runs, then the median of {args.repeats} runs timed with CUDA "
        "events. "
        + (
            "'prefill'/'decode' hold CUDA graph replays of that forward (the step captured "
            "whole, with the untimed cache-position reset inside the graph): GPU time without "
            "the host's kernel-launch gaps. 'prefill_eager'/'decode_eager' hold the same "
            "forwards run eagerly from Python (launch-bound on this host below ~1k prefill "
            "tokens and for every decode point). "
            if use == "graph"
            else "'prefill'/'decode' hold eager forwards run from Python. "
        )
        + f"Decode points whose KV cache exceeds {args.kv_fraction:.0%} of the memory free "
        "after loading the weights are left out."
    )
    prof = {
        "schema": "nitsum-profile/1",
        "device": name,
        "model": "Llama-3.1-8B-shape (random weights)"
        if args.layers == 32
        else f"Llama-3.1-8B-shape, {args.layers} layers (random weights)",
        "dtype": "bfloat16",
        "analytic": False,
        "date": date.today().isoformat(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "generator": "scripts/profile_gpu.py",
        },
        "host": {
            "gpu": gpu_name,
            "gpu_memory_bytes": int(total),
            "params": n_params,
            "weight_bytes": weight_bytes,
            "kv_bytes_per_token": kv_per_token,
            "measured_ceilings": ceil,
        },
        "method": method,
        "max_context": 8192,
        "tp_levels": [1],
        "prefill": {"1": prefill},
        "decode": {"1": decode},
    }
    for mode, suffix in (("eager", "eager"), ("graph", "cuda_graph")):
        if mode != use and (points[mode]["prefill"] or points[mode]["decode"]):
            prof[f"prefill_{suffix}"] = {"1": points[mode]["prefill"]}
            prof[f"decode_{suffix}"] = {"1": points[mode]["decode"]}
    if graph_errors:
        prof["cuda_graph_errors"] = graph_errors[:5]
    prof["skipped_decode_points"] = skipped
    prof["sdpa_calls"] = sdpa_calls
    prof["detail_ms"] = detail
    text = json.dumps(prof, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(
            f"wrote {args.out}: {len(prefill)} prefill, {len(decode)} decode points, "
            f"{len(skipped)} decode points skipped",
            flush=True,
        )
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
