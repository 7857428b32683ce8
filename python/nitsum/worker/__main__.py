"""`nitsum worker`: a worker process serving one device (TP 1), or with `--devices N` a host
worker serving N local devices with runtime TP switching; either way one router worker per
device id."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from nitsum.config import BIND_POLICIES, DTYPES, HOST_KV_CACHE_MB, mebibytes
from nitsum.parallel.shift import DEFAULT_SHIFT_THRESHOLD, ShiftRule, shift_rule

if TYPE_CHECKING:
    from nitsum.engine.engine_config import EngineConfig

DEFAULT_ROUTER = "tcp://127.0.0.1:5557"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nitsum worker", description=__doc__)
    p.add_argument("--model", default="default", help="'default', an HF dir or a .gguf file")
    p.add_argument(
        "--worker-id", type=int, required=True, help="ZMQ identity; with --devices N: of device 0"
    )
    p.add_argument(
        "--devices", type=int, default=1, help="N > 1: a host worker over N local devices"
    )
    p.add_argument(
        "--router",
        default=DEFAULT_ROUTER,
        help="the router's worker address; several routers in front of one pool: every "
        "router's, comma-separated (the worker registers with each)",
    )
    p.add_argument("--served-model-name", default=None, help="model name sent in register")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda:0, ...)")
    p.add_argument("--kv-cache-mb", type=int, default=512, help="KV pool size in MiB")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weights, activations and KV")
    p.add_argument(
        "--host-kv-cache-mb",
        type=mebibytes,
        default=HOST_KV_CACHE_MB,
        help="host memory per device for swapped-out KV, MiB (0: preemption recomputes)",
    )
    p.add_argument(
        "--device-step-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="a device step's deadline is S plus 4x its expected time; a device process that "
        "misses it is killed and its requests resume elsewhere",
    )
    p.add_argument(
        "--bind-idle",
        action="store_true",
        help="under light load, bind idle devices into a TP group for a request with a TTFT "
        "target (per-request TP binding's load trigger; needs --devices > 1)",
    )
    p.add_argument(
        "--binding-profile",
        default=None,
        metavar="PATH",
        help="a nitsum-profile/1 JSON of this model on these devices: the cost model that "
        "decides whether a tier's bind_tp or --bind-idle binding pays (default: none, every "
        "trigger binds; `nitsum serve` passes its --profile)",
    )
    p.add_argument(
        "--bind-policy",
        choices=BIND_POLICIES,
        default="cost",
        help="cost: bind (in full, for the prompt only, or not at all) as the cost model of "
        "--binding-profile says; always: every trigger binds in full (default: cost)",
    )
    p.add_argument(
        "--shift-threshold",
        type=shift_rule,
        default=ShiftRule(),
        help="batched tokens above which a TP group runs the iteration as sequence "
        "parallelism: N, off (TP only), or per group size SIZE=N, comma-separated "
        f"(default {DEFAULT_SHIFT_THRESHOLD}; `nitsum serve` passes a profile's crossovers)",
    )
    p.add_argument("--page-tokens", type=int, default=16, help="tokens per KV page at TP 1")
    p.add_argument("--seed", type=int, default=None, help="seed each device's random draws")
    p.add_argument("--enforce-eager", action="store_true", help="record no steps (no CUDA graphs)")
    p.add_argument(
        "--max-batch", type=int, default=None, help="running sequences cap (cpu 64, cuda 256)"
    )
    p.add_argument(
        "--token-budget", type=int, default=None, help="tokens per step (cpu 512, cuda 8192)"
    )
    p.add_argument("--max-context", type=int, default=None, help="cap the context window")
    p.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV of prompt prefixes already computed",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (--devices 1)")
    p.add_argument(
        "--devices-per-gpu",
        type=int,
        default=1,
        help="with --devices N on CUDA: device processes per GPU (device d on GPU d // K)",
    )
    p.add_argument(
        "--collectives",
        choices=("auto", "dist", "shared"),
        default="auto",
        help="what carries a TP group's collectives (docs/serving.md)",
    )
    p.add_argument(
        "--worker-secret-file",
        default=None,
        help="file holding the shared worker secret (default: the NITSUM_WORKER_SECRET "
        "environment variable; never pass the secret itself on the command line)",
    )
    p.add_argument(
        "--kv-peers",
        default=None,
        help="tcp://HOST:PORT: the rendezvous of the KV transport between host worker "
        "processes (P/D across hosts; rank 0 listens there); with --kv-rank and --kv-world",
    )
    p.add_argument("--kv-rank", type=int, default=0, help="this process's rank in --kv-peers")
    p.add_argument("--kv-world", type=int, default=1, help="host worker processes in --kv-peers")
    p.add_argument(
        "--kv-timeout-s",
        type=float,
        default=5.0,
        help="bound on each message of a KV handoff (below the router's heartbeat timeout: "
        "a send holds this process's loop)",
    )
    p.add_argument(
        "--kv-backend",
        choices=("auto", "nixl", "gloo"),
        default="auto",
        help="how --kv-peers moves KV: nixl (device pages READ by the receiver), gloo (through "
        "host memory, the fallback), auto: nixl when every process has it, else gloo with a "
        "warning naming why",
    )
    p.add_argument(
        "--kv-rendezvous-s",
        type=float,
        default=300.0,
        help="how long to wait at start-up for every process of --kv-peers",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def worker_secret(path: str | None) -> bytes | None:
    """The shared worker secret: the file's first line, else $NITSUM_WORKER_SECRET, else None.

    NOTE: stripped like the router strips it, so both sides key the HMAC with the same bytes.
    """
    from nitsum.worker.protocol import SECRET_ENV

    text = Path(path).read_text().splitlines()[0] if path else os.environ.get(SECRET_ENV, "")
    return text.strip().encode() or None


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine settings the parsed worker flags ask for (every engine flag lands here)."""
    import torch

    from nitsum.engine.engine_config import EngineConfig

    return EngineConfig(
        dtype=getattr(torch, args.dtype),
        device=args.device,
        kv_cache_bytes=args.kv_cache_mb << 20,
        host_kv_cache_bytes=args.host_kv_cache_mb << 20,
        device_step_timeout_s=args.device_step_timeout,
        page_tokens=args.page_tokens,
        max_batch=args.max_batch,
        token_budget=args.token_budget,
        max_context=args.max_context,
        prefix_caching=args.prefix_caching,
        bind_idle=args.bind_idle,
        binding_profile=args.binding_profile,
        bind_policy=args.bind_policy,
        shift=args.shift_threshold,
        # NOTE: a KV handoff to a peer process reads a request's pages as soon as its first
        # token is out, which an overlapped step has already scheduled on: synchronous then.
        overlap=False if args.kv_peers else None,
        # NOTE: no kernel compile inside a serving step (engine/attention_warmup.py).
        warm_kernels=args.device.startswith("cuda"),
        devices_per_gpu=args.devices_per_gpu,
        collectives=args.collectives,
        seed=args.seed,
        # NOTE: False, not None: None means "on CUDA".
        decode_graphs=False if args.enforce_eager else None,
        piecewise_graphs=False if args.enforce_eager else None,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse flags, load the model, serve until `shutdown`, SIGTERM or SIGINT."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s worker{args.worker_id} %(levelname)s %(name)s: %(message)s",
    )
    import torch

    from nitsum.engine.load import resolve_model_dir
    from nitsum.pool.device_pool import DeviceError
    from nitsum.pool.local import open_local_engine
    from nitsum.worker.backend import PoolBackend
    from nitsum.worker.host import open_pool_backend
    from nitsum.worker.server import WorkerServer

    if args.devices < 1:
        print("nitsum worker: --devices must be >= 1", file=sys.stderr)
        return 2
    routers = [a.strip() for a in args.router.split(",") if a.strip()]
    if not routers:
        print("nitsum worker: --router names no address", file=sys.stderr)
        return 2
    if args.kv_peers and len(routers) > 1:
        # NOTE: a request handed over by a KV peer streams on the decode target's socket, and
        # the peer does not say which router sent it (docs/deployment.md "Several routers").
        print(
            "nitsum worker: --kv-peers serves one router; several --router addresses are not "
            "supported with it yet",
            file=sys.stderr,
        )
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda:"):
        torch.cuda.set_device(torch.device(args.device))  # Triton and graphs use the current
    try:
        ecfg = engine_config(args)
    except ValueError as e:
        print(f"nitsum worker: {e}", file=sys.stderr)
        return 2
    backend: PoolBackend
    try:
        model_dir = resolve_model_dir(args.model)
        if args.devices == 1:  # the N = 1 pool: one device in this process
            backend = PoolBackend(open_local_engine(model_dir, ecfg), args.worker_id)
        else:
            backend = open_pool_backend(model_dir, ecfg, args.devices, args.worker_id)
    except (ValueError, FileNotFoundError, ImportError, DeviceError) as e:
        print(f"nitsum worker: cannot load model {args.model!r}: {e}", file=sys.stderr)
        return 2
    name = args.served_model_name or model_dir.name
    try:
        secret = worker_secret(args.worker_secret_file)
    except (OSError, IndexError) as e:
        print(f"nitsum worker: cannot read --worker-secret-file: {e}", file=sys.stderr)
        return 2
    if args.kv_peers:
        from nitsum.pool.kv_rendezvous import open_kv_transport

        try:
            peers = open_kv_transport(
                args.kv_peers,
                args.kv_rank,
                args.kv_world,
                backend.pe.pool,
                backend.device_ids,
                args.kv_backend,
                args.kv_timeout_s,
                rendezvous_s=args.kv_rendezvous_s,
                # Tests only: a stall between a handoff's metadata and its KV (gloo) or before
                # the receiver reads it (NIXL, while the file exists), to cut it mid-transfer.
                stall_s=float(os.environ.get("NITSUM_TEST_KV_STALL_S", "0")),
                stall_file=os.environ.get("NITSUM_TEST_KV_STALL_FILE"),
            )
        except (ValueError, RuntimeError) as e:  # a bad address, no rendezvous, no NIXL
            print(f"nitsum worker: --kv-peers {args.kv_peers}: {e}", file=sys.stderr)
            backend.pe.pool.close()
            return 2
        backend.attach_peers(peers)
    server = WorkerServer(
        backend, routers, name, device=args.device, secret=secret, kv_transport=args.kv_peers
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("signal %d: stopping", signum)
        server.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.run()
    finally:
        backend.pe.pool.close()  # stops the device processes, if any
    if args.kv_peers:
        # NOTE: the transport's receivers wait in gloo, which cannot cancel them; a normal
        # interpreter exit would abort on them (pool/peers.py). Everything is closed here.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
