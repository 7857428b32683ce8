"""`vllm serve`'s other launch flags: each lands on what Nitsum has, or is refused by name.

A vLLM user's launch line must either work or stop with a message naming the flag and why
(exit 2 before anything starts), never with argparse's "unrecognized arguments". Where each
flag lands (docs/serving.md, "vLLM flags"):

- the router: `--root-path`, `--ssl-certfile`/`--ssl-keyfile` (TLS), `--uvicorn-log-level`
  (its log level), `--disable-log-requests`, `--tokenizer`, `--generation-config`, and the
  parsers `--tool-call-parser`, `--reasoning-parser`, `--enable-auto-tool-choice` (passed
  through under the same names: the router parses);
- the workers: `--seed`, `--enforce-eager`, `--block-size` (KV page tokens),
  `--max-num-batched-tokens` (the token budget), `--swap-space` (the host KV tier);
- the pool: `--data-parallel-size` (devices = DP x TP);
- accepted as they are what Nitsum always does: `--enable-chunked-prefill`,
  `--pipeline-parallel-size 1`, `--kv-cache-dtype auto`, `--trust-remote-code` and
  `--disable-log-stats` (each says why in the log);
- refused: `--quantization`, `--lora-modules`, `--speculative-config`, `--kv-cache-dtype`
  other than auto, `--no-enable-chunked-prefill`, `--pipeline-parallel-size` above 1.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from nitsum.serve_devices import positive_int

log = logging.getLogger("nitsum.serve")

# NOTE: the router's prefix index hashes prompts in blocks of this many tokens
# (scheduler-rs/src/prefix_index.rs BLOCK): a KV page must tile it, or a cached block would
# straddle pages the worker's prefix cache frees apart.
ROUTER_PREFIX_BLOCK = 64
# uvicorn's log levels, as the router's (tracing) levels.
UVICORN_LOG_LEVELS = {
    "critical": "error",
    "error": "error",
    "warning": "warn",
    "info": "info",
    "debug": "debug",
    "trace": "trace",
}
# Flags Nitsum has nothing for: why, as the refusal says it.
REFUSED = {
    "quantization": "Nitsum runs unquantized weights only (--dtype float32, bfloat16 or float16)",
    "lora_modules": "Nitsum serves no LoRA adapters (one model with its own weights)",
    "speculative_config": "Nitsum has no speculative decoding",
}


def _add_router_flags(v: argparse._ArgumentGroup) -> None:
    v.add_argument("--root-path", default=None, help="URL prefix a proxy adds (stripped)")
    v.add_argument("--ssl-certfile", default=None, help="PEM certificate chain: serve HTTPS")
    v.add_argument("--ssl-keyfile", default=None, help="PEM private key of --ssl-certfile")
    v.add_argument(
        "--uvicorn-log-level",
        choices=tuple(UVICORN_LOG_LEVELS),
        default=None,
        help="the router's log level",
    )
    v.add_argument("--disable-log-requests", action="store_true", help="no log line per request")
    v.add_argument(
        "--tokenizer",
        default=None,
        help="a directory with tokenizer.json (and its chat template) used instead of the model's",
    )
    v.add_argument(
        "--generation-config",
        default="auto",
        help="default sampling values: auto (the model's generation_config.json), vllm "
        "(none), or a directory holding generation_config.json",
    )
    v.add_argument("--tool-call-parser", default=None, help="the router's tool-call parser")
    v.add_argument("--reasoning-parser", default=None, help="the router's reasoning parser")
    v.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="let the model call tools on its own (tool_choice auto)",
    )


def _add_engine_flags(v: argparse._ArgumentGroup) -> None:
    v.add_argument("--seed", type=int, default=None, help="seed every device's random draws")
    v.add_argument(
        "--enforce-eager", action="store_true", help="record no CUDA graphs (every step eager)"
    )
    v.add_argument(
        "--block-size",
        type=positive_int,
        default=None,
        help=f"tokens per KV page (must divide {ROUTER_PREFIX_BLOCK}; default 16)",
    )
    v.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        help="tokens per step (the same as --token-budget)",
    )
    v.add_argument(
        "--swap-space",
        type=float,
        default=None,
        help="GiB of host memory per device for swapped-out KV (as --host-kv-cache-mb)",
    )
    v.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="accepted: prompts are always chunked to the token budget",
    )
    v.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=positive_int,
        default=None,
        help="1 only: pipeline stages are the control loop's runtime choice",
    )
    v.add_argument(
        "--data-parallel-size",
        "-dp",
        type=positive_int,
        default=None,
        help="replicas: the devices are DP x TP (sets --workers)",
    )
    v.add_argument(
        "--kv-cache-dtype", default=None, help="auto only: the KV cache has the model's dtype"
    )
    v.add_argument("--trust-remote-code", action="store_true", help="accepted (see the log)")
    v.add_argument("--disable-log-stats", action="store_true", help="accepted (see the log)")
    for name, why in REFUSED.items():
        v.add_argument(f"--{name.replace('_', '-')}", default=None, help=f"refused: {why}")


def add_launch_flags(p: argparse.ArgumentParser) -> None:
    """The `vllm serve` flags beyond serve_flags' own; checked by `resolve_launch_flags`."""
    v = p.add_argument_group("more vLLM flags", "each works or is refused by name")
    _add_router_flags(v)
    _add_engine_flags(v)


def _refusals(args: argparse.Namespace) -> list[str]:
    errors = [
        f"--{name.replace('_', '-')}: {why}"
        for name, why in REFUSED.items()
        if getattr(args, name) is not None
    ]
    if args.kv_cache_dtype not in (None, "auto"):
        errors.append(
            f"--kv-cache-dtype {args.kv_cache_dtype}: Nitsum keeps KV in the model's dtype "
            "(no fp8 KV cache); use auto"
        )
    if args.enable_chunked_prefill is False:
        errors.append(
            "--no-enable-chunked-prefill: Nitsum always chunks prompts to the token budget "
            "(it is how short prompts overtake long ones)"
        )
    pp = args.pipeline_parallel_size
    if pp is not None and pp > 1:
        errors.append(
            f"--pipeline-parallel-size {pp}: pipeline stages are the control loop's runtime "
            "choice, not a launch setting; give the devices with --workers"
        )
    return errors


def _engine_settings(args: argparse.Namespace) -> list[str]:
    errors = []
    if args.block_size is not None and ROUTER_PREFIX_BLOCK % args.block_size:
        errors.append(
            f"--block-size {args.block_size}: must divide the router's {ROUTER_PREFIX_BLOCK}-"
            "token prefix block (1, 2, 4, 8, 16, 32 or 64)"
        )
    budget = args.max_num_batched_tokens
    if budget is not None:
        if args.token_budget is not None and args.token_budget != budget:
            errors.append(f"--max-num-batched-tokens {budget} and --token-budget differ")
        args.token_budget = budget
    if args.swap_space is not None:
        if args.swap_space < 0:
            errors.append(f"--swap-space {args.swap_space}: must be >= 0 GiB")
        args.host_kv_cache_mb = round(args.swap_space * 1024)
    dp = args.data_parallel_size
    if dp is not None:
        devices = dp * (args.tensor_parallel_size or 1)
        if getattr(args, "workers_given", False) and args.workers != devices:
            errors.append(
                f"--data-parallel-size {dp}: {devices} devices (DP x TP), but --workers "
                f"{args.workers}"
            )
        args.workers = devices
    return errors


def _router_settings(args: argparse.Namespace) -> list[str]:
    errors = []
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        errors.append("--ssl-certfile and --ssl-keyfile go together (HTTPS needs both)")
    for flag, path in (("--ssl-certfile", args.ssl_certfile), ("--ssl-keyfile", args.ssl_keyfile)):
        if path is not None and not Path(path).is_file():
            errors.append(f"{flag} {path}: no such file")
    if args.root_path is not None and not args.root_path.startswith("/"):
        errors.append(f"--root-path {args.root_path}: must start with /")
    if args.tokenizer is not None and not (Path(args.tokenizer) / "tokenizer.json").is_file():
        errors.append(
            f"--tokenizer {args.tokenizer}: not a directory with tokenizer.json (Nitsum "
            "reads local tokenizers only)"
        )
    gen = args.generation_config
    if gen not in ("auto", "vllm") and not (Path(gen) / "generation_config.json").is_file():
        errors.append(
            f"--generation-config {gen}: auto, vllm or a directory with generation_config.json"
        )
    return errors


def resolve_launch_flags(args: argparse.Namespace) -> list[str]:
    """Check the launch flags and fold those with a Nitsum twin into it (`--max-num-batched-
    tokens` into `token_budget`, `--swap-space` into `host_kv_cache_mb`, `-dp` into
    `workers`); returns errors (empty: fine) and logs why the no-op ones change nothing."""
    errors = _refusals(args) + _engine_settings(args) + _router_settings(args)
    if args.trust_remote_code:
        log.info(
            "--trust-remote-code: Nitsum runs no code from the model directory (its own "
            "Llama/Qwen2/Mistral implementations); nothing to trust"
        )
    if args.disable_log_stats:
        log.info("--disable-log-stats: Nitsum logs no periodic stats; /metrics has them")
    return errors


def router_launch_flags(args: argparse.Namespace) -> list[str]:
    """The router's flags these ask for (NOTE: the parsers keep their names there)."""
    flags: list[str] = []
    for name in ("root_path", "tool_call_parser", "reasoning_parser"):
        value = getattr(args, name, None)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", value]
    for name in ("ssl_certfile", "ssl_keyfile", "tokenizer"):
        value = getattr(args, name, None)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(Path(value).resolve())]
    gen = getattr(args, "generation_config", "auto")
    if gen != "auto":
        flags += ["--generation-config", gen if gen == "vllm" else str(Path(gen).resolve())]
    level = getattr(args, "uvicorn_log_level", None)
    if level is not None:
        flags += ["--log-level", UVICORN_LOG_LEVELS[level]]
    for name in ("enable_auto_tool_choice", "disable_log_requests"):
        if getattr(args, name, False):
            flags.append(f"--{name.replace('_', '-')}")
    return flags


def worker_launch_flags(args: argparse.Namespace) -> list[str]:
    """The workers' flags these ask for (the token budget and host tier go as their own)."""
    flags: list[str] = []
    if getattr(args, "seed", None) is not None:
        flags += ["--seed", str(args.seed)]
    if getattr(args, "enforce_eager", False):
        flags.append("--enforce-eager")
    if getattr(args, "block_size", None) is not None:
        flags += ["--page-tokens", str(args.block_size)]
    return flags


def https(args: argparse.Namespace) -> bool:
    """Whether the router serves HTTPS (`nitsum serve` then polls it over TLS)."""
    return getattr(args, "ssl_certfile", None) is not None
