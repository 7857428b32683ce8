"""`nitsum serve` flags: its own, and the vLLM spellings a vLLM user types first.

NOTE: abbreviations are off (`allow_abbrev=False`): `--tp 1` must not read as `--tp-switching`.
The vLLM flags (docs/serving.md, "vLLM flags") map onto Nitsum's own: `--max-num-seqs` is
`--max-batch`, `--max-model-len` caps the context, `--api-key` feeds the router's API keys, a
positional model is `--model`; `resolve_flags` checks and resolves what needs the model. The
other `vllm serve` flags, each working or refused by name, are in serve_launch_flags.py.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from nitsum.config import DTYPES, HOST_KV_CACHE_MB, mebibytes
from nitsum.parallel.shift import shift_rule
from nitsum.serve_binding import add_binding_flags
from nitsum.serve_devices import add_device_flags, positive_int, resolve_devices
from nitsum.serve_kv_sizing import CPU_KV_CACHE_MB, DEFAULT_GPU_MEMORY_UTILIZATION
from nitsum.serve_launch_flags import add_launch_flags, resolve_launch_flags

log = logging.getLogger("nitsum.serve")

DEFAULT_WORKER_ADDR = "tcp://127.0.0.1:5557"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def memory_fraction(text: str) -> float:
    """argparse type: a fraction in (0, 1]."""
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _add_vllm_flags(p: argparse.ArgumentParser) -> None:
    """The vLLM spellings (`vllm serve`); each lands on a Nitsum setting."""
    v = p.add_argument_group("vLLM flags", "the names `vllm serve` uses (docs/serving.md)")
    v.add_argument(
        "model_positional",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="the model, as --model (a directory, a .gguf file or an HF repo id in the local "
        "HF cache)",
    )
    v.add_argument(
        "--api-key",
        action="append",
        default=[],
        dest="api_keys",
        help="an API key clients must send (`Authorization: Bearer KEY`); repeatable",
    )
    v.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="context window cap in tokens (prompt + output); longer prompts get a 400",
    )
    v.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        default=None,
        help="devices per TP group: the planner's lowest TP level with the control loop, the "
        "fixed level without (aligned groups; above 1 one host worker serves the devices)",
    )
    v.add_argument(
        "--gpu-memory-utilization",
        type=memory_fraction,
        default=None,
        help="with --device cuda: size each device's KV pool so that this fraction of its "
        "memory is used (weights included); overrides --kv-cache-mb",
    )
    v.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        dest="prefix_caching",
        help="reuse the KV of prompt prefixes already computed (default on)",
    )
    v.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template file used instead of the model's own",
    )
    v.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=None,
        dest="max_batch",
        help="running sequences cap per device (the same as --max-batch)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nitsum serve",
        description="Serve a model (router + workers)",
        allow_abbrev=False,
    )
    p.add_argument(
        "--model",
        default=None,
        help="'default' (the embedded model), an HF dir, a .gguf file or an HF repo id found "
        "in the local HF cache",
    )
    add_device_flags(p)
    p.add_argument(
        "--tp-switching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the N devices from one host worker that switches TP and hands prefilled "
        "KV to decode groups on `reconfigure` (default: on with the control loop on CPU; "
        "--no-tp-switching: one worker process per device)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--config", default=None, help="router config (tiers, API keys)")
    p.add_argument(
        "--profile",
        default=None,
        help="performance profile for the router's control loop (planner every window); "
        "default: a measured profile of the model from ./profiles or the shipped profiles/",
    )
    p.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="no control loop: a static plan (every worker its own TP-1 mixed group)",
    )
    p.add_argument("--router-bin", default=None, help="router executable")
    p.add_argument("--worker-addr", default=DEFAULT_WORKER_ADDR, help="router's ZMQ address")
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="names served on /v1/models and accepted as `model` (several: aliases of one "
        "model; the first is the one reported); default: the model dir's name",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker")
    p.add_argument(
        "--kv-cache-mb",
        type=int,
        default=None,
        help=f"KV pool per device in MiB (default: on CPU {CPU_KV_CACHE_MB}; on CUDA sized by "
        f"--gpu-memory-utilization {DEFAULT_GPU_MEMORY_UTILIZATION}, as vLLM does)",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="weights, activations and KV; auto: float32 on CPU, the model's torch_dtype "
        "(bfloat16 when it names none) on CUDA (bfloat16: about 2.6x the decode speed of "
        "float32 on a CPU with AVX512-BF16, half the memory)",
    )
    p.add_argument(
        "--host-kv-cache-mb",
        type=mebibytes,
        default=HOST_KV_CACHE_MB,
        help="host memory per device for swapped-out KV (0: preemption recomputes)",
    )
    p.add_argument(
        "--device-step-timeout",
        type=float,
        default=None,
        metavar="S",
        help="passed to every worker: a device step's deadline is S plus 4x its expected time "
        "(default: the worker's, 5); a device process that misses it (hung, stopped) is killed "
        "and its requests resume elsewhere",
    )
    p.add_argument(
        "--max-batch", type=int, default=None, help="running sequences cap (cpu 64, cuda 256)"
    )
    p.add_argument(
        "--token-budget", type=int, default=None, help="tokens per step (cpu 512, cuda 8192)"
    )
    p.add_argument(
        "--bind-idle",
        action="store_true",
        help="with --tp-switching: under light load, run a strict request on a TP group bound "
        "from idle devices (docs/architecture.md, 'Per-request TP binding')",
    )
    add_binding_flags(p)
    p.add_argument(
        "--shift-threshold",
        type=shift_rule,
        default=None,
        help="with --tp-switching: batched tokens above which a TP group runs the iteration as "
        "sequence parallelism (N, off, or SIZE=N per group size, comma-separated); default: "
        "the control profile's measured crossovers, else the worker's default",
    )
    p.add_argument(
        "--kv-transport",
        action="store_true",
        help="with --no-tp-switching: join the worker processes by a KV transport on a free "
        "loopback port, so the planner may split prefill/decode across them (a restarted "
        "worker runs without it, which turns such splits off)",
    )
    p.add_argument(
        "--routers",
        type=int,
        default=1,
        help="N routers in front of the pool, on ports --port..--port+N-1 (workers on "
        "--worker-addr's port + i); one plans, the others follow; put a load balancer in "
        "front (docs/serving.md, 'Several routers behind a load balancer')",
    )
    p.add_argument(
        "--router-lease",
        default=None,
        help="the routers' planning lease: etcd:http://HOST:PORT[/KEY] across hosts (default "
        "with --routers > 1: a file lock in this run's directory)",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds")
    p.add_argument("--stop-timeout", type=float, default=10.0, help="seconds before SIGKILL")
    p.add_argument(
        "--restart-workers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start a worker that exits again, with backoff (1 s doubling to 30 s while it "
        "keeps dying within a minute)",
    )
    p.add_argument(
        "--restart-router",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the router again when it exits (same backoff); the workers re-register "
        "with it (docs/serving.md, 'When the router dies')",
    )
    _add_vllm_flags(p)
    add_launch_flags(p)
    return p


def resolve_dtype(dtype: str, device: str, model_dir: Path) -> str:
    """`--dtype auto`: float32 on CPU (the engine's CPU default); on CUDA the model's
    `torch_dtype` when it is one Nitsum runs, else bfloat16."""
    if dtype != "auto":
        return dtype
    if not device.startswith("cuda"):
        return "float32"
    try:
        named = json.loads((model_dir / "config.json").read_text()).get("torch_dtype")
    except (OSError, ValueError, AttributeError):
        named = None
    return named if named in DTYPES else "bfloat16"


def resolve_flags(args: argparse.Namespace) -> list[str]:
    """Check and normalize what the vLLM flags ask for; returns errors (empty: fine).

    Sets `args.model` from the positional model, and warns loudly when the HTTP port is
    open beyond loopback without API keys."""
    errors = []
    if args.model_positional is not None:
        if args.model is not None and args.model != args.model_positional:
            errors.append(
                f"two models: {args.model_positional!r} and --model {args.model!r}; give one"
            )
        args.model = args.model_positional
    if args.model is None:
        args.model = "default"
    errors += resolve_launch_flags(args)
    errors += resolve_devices(args)
    tp = args.tensor_parallel_size
    if tp is not None and tp > args.workers:
        errors.append(f"--tensor-parallel-size {tp} needs at least {tp} --workers")
    if tp is not None and tp > 1 and args.tp_switching is False:
        errors.append(
            f"--tensor-parallel-size {tp} needs one host worker for the devices of a group "
            "(drop --no-tp-switching)"
        )
    if args.gpu_memory_utilization is not None and args.device != "cuda":
        errors.append("--gpu-memory-utilization sizes KV on CUDA only (--device cuda)")
    if args.chat_template is not None and not Path(args.chat_template).is_file():
        errors.append(f"--chat-template {args.chat_template}: no such file")
    if args.host not in LOOPBACK_HOSTS and not args.api_keys and not args.config:
        log.warning(
            "!!! --host %s serves every network this machine is on WITHOUT API keys: anyone "
            "who can reach port %d can use the model. Pass --api-key KEY (or api_keys in "
            "--config). !!!",
            args.host,
            args.port,
        )
    return errors
