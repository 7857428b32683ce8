"""The command lines `nitsum serve` starts: the router's, a device worker's, the host worker's.

NOTE: the one place that knows the router's and the workers' flags as `nitsum serve` passes them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from nitsum.serve_binding import binding_flags
from nitsum.serve_flags import resolve_dtype
from nitsum.serve_launch_flags import router_launch_flags, worker_launch_flags

ROUTER_EXE = "nitsum-router"
# NOTE: API keys reach the router in its environment (newline-separated), never on a command
# line that `ps` shows; the router adds them to its config's (scheduler-rs/src/config.rs).
API_KEYS_ENV = "NITSUM_API_KEYS"


class ServeError(RuntimeError):
    """Startup failed; the message says what to do."""


def resolve_router(router_bin: str | None = None) -> list[str]:
    """The command prefix that runs the router: `--router-bin`, `nitsum-router` on PATH or next
    to the Python executable, else `nitsum._core.router_main` in a Python subprocess."""
    if router_bin:
        path = Path(router_bin).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServeError(f"--router-bin {router_bin}: not an executable file")
        return [str(path)]
    found = shutil.which(ROUTER_EXE)
    if found:
        return [found]
    beside = Path(sys.executable).parent / ROUTER_EXE
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    if importlib.util.find_spec("nitsum._core") is not None:
        import nitsum._core as core  # the maturin-built native module

        if hasattr(core, "router_main"):
            # NOTE: assumes router_main(argv with the program name) -> exit code, like cli_main.
            code = (
                "import sys, nitsum._core as c; "
                "sys.exit(c.router_main(['nitsum-router', *sys.argv[1:]]))"
            )
            return [sys.executable, "-c", code]
    raise ServeError(
        f"cannot find the router: no {ROUTER_EXE!r} on PATH or in {beside.parent}, and no "
        "nitsum._core.router_main; build it (`cargo build --release -p nitsum-scheduler` or "
        "`maturin develop`) or pass --router-bin PATH"
    )


def router_command(
    prefix: list[str],
    host: str,
    port: int,
    worker_addr: str,
    model_dir: Path,
    served_model_names: list[str],
    config: str | None = None,
    profile: str | None = None,
    args: argparse.Namespace | None = None,
) -> list[str]:
    """The router's command line. NOTE: the one place that knows the router's flags.

    The first served name is the model's; the others are aliases it also answers to."""
    cmd = [*prefix, "--listen", f"{host}:{port}", "--worker-addr", worker_addr]
    cmd += ["--model-dir", str(model_dir), "--served-model-name", served_model_names[0]]
    for alias in served_model_names[1:]:
        cmd += ["--model-alias", alias]
    if config:
        cmd += ["--config", config]
    if profile:
        cmd += ["--profile", profile]
    if args is not None and getattr(args, "tensor_parallel_size", None):
        cmd += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    if args is not None and getattr(args, "chat_template", None):
        cmd += ["--chat-template", str(Path(args.chat_template).resolve())]
    if args is not None:
        cmd += router_launch_flags(args)
    return cmd


def step_limit_flags(args: argparse.Namespace) -> list[str]:
    """--max-batch / --token-budget as given; absent ones take the worker's device default."""
    flags = []
    if getattr(args, "max_batch", None) is not None:
        flags += ["--max-batch", str(args.max_batch)]
    if getattr(args, "token_budget", None) is not None:
        flags += ["--token-budget", str(args.token_budget)]
    return flags


def engine_flags(args: argparse.Namespace, model_dir: Path) -> list[str]:
    """The engine settings every worker gets alike (KV pools, dtype, limits, caching, the
    binding cost model's profile and policy)."""
    dtype = resolve_dtype(args.dtype, args.device, model_dir)
    # NOTE: `nitsum serve` has sized the pool by now (serve_kv_sizing.kv_sizing); unsized, the
    # worker's own default applies.
    flags = step_limit_flags(args)
    if getattr(args, "kv_cache_mb", None) is not None:
        flags += ["--kv-cache-mb", str(args.kv_cache_mb)]
    flags += ["--host-kv-cache-mb", str(args.host_kv_cache_mb), "--dtype", dtype]
    if getattr(args, "device_step_timeout", None) is not None:
        flags += ["--device-step-timeout", str(args.device_step_timeout)]
    if getattr(args, "max_model_len", None) is not None:
        flags += ["--max-context", str(args.max_model_len)]
    if getattr(args, "prefix_caching", True) is False:
        flags += ["--no-prefix-caching"]
    return flags + worker_launch_flags(args) + binding_flags(args)


def worker_command(
    worker_id: int,
    model_dir: Path,
    worker_addr: str,
    served_model_name: str,
    args: argparse.Namespace,
) -> list[str]:
    """One device worker's command line (`python -m nitsum.worker`)."""
    k = getattr(args, "devices_per_gpu", 1)
    device = f"cuda:{worker_id // k}" if args.device == "cuda" else args.device
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    cmd = [sys.executable, "-m", "nitsum.worker", "--model", str(model_dir)]
    cmd += ["--worker-id", str(worker_id), "--router", worker_addr, "--device", device]
    cmd += ["--served-model-name", served_model_name, "--threads", str(threads)]
    cmd += engine_flags(args, model_dir)
    if getattr(args, "kv_peers_addr", None):
        cmd += ["--kv-peers", args.kv_peers_addr, "--kv-rank", str(worker_id)]
        cmd += ["--kv-world", str(args.workers)]
    return cmd


KV_FLAGS = ("--kv-peers", "--kv-rank", "--kv-world")


def without_kv_transport(cmd: list[str]) -> list[str]:
    """`cmd` without the KV transport flags (and their values).

    NOTE: a restarted worker cannot rejoin the transport's process group (formed once), so
    it runs without one; it registers no `kv_transport`, and the router then plans no P/D
    across processes (docs/serving.md, "Several hosts")."""
    out: list[str] = []
    skip = False
    for arg in cmd:
        if skip:
            skip = False
        elif arg in KV_FLAGS:
            skip = True
        else:
            out.append(arg)
    return out


def host_worker_command(
    model_dir: Path, worker_addr: str, served_model_name: str, args: argparse.Namespace
) -> list[str]:
    """The host worker's command line: devices (worker ids) 0..N-1 in one process.

    Its device processes split the CPU cores between them (DevicePool), so no --threads.
    """
    cmd = [sys.executable, "-m", "nitsum.worker", "--model", str(model_dir)]
    cmd += ["--worker-id", "0", "--devices", str(args.workers), "--router", worker_addr]
    cmd += ["--device", args.device, "--served-model-name", served_model_name]
    cmd += engine_flags(args, model_dir)
    if getattr(args, "devices_per_gpu", 1) > 1:
        cmd += ["--devices-per-gpu", str(args.devices_per_gpu)]
    if getattr(args, "collectives", "auto") != "auto":
        cmd += ["--collectives", args.collectives]
    if args.bind_idle:
        cmd += ["--bind-idle"]
    if args.shift_threshold is not None:
        cmd += ["--shift-threshold", args.shift_threshold.spec()]
    return cmd
