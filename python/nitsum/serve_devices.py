"""`nitsum serve`'s device flags: how many devices, of what kind, how many per GPU, and what
carries their collectives (docs/serving.md, "Several devices on one GPU")."""

from __future__ import annotations

import argparse

from nitsum.parallel.communicators import COLLECTIVES, resolve_collectives


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class NoteGiven(argparse.Action):
    """Store the value and note that the flag was given (`args.<dest>_given`): a default
    that depends on other flags must not override what the user typed."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:  # fmt: skip
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def add_device_flags(p: argparse.ArgumentParser) -> None:
    """--workers, --device, --devices-per-gpu, --collectives (checked by `resolve_devices`)."""
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        action=NoteGiven,
        help="devices (worker ids 0..N-1); default 2, or with --devices-per-gpu K the GPU's K "
        "devices",
    )
    p.add_argument(
        "--device", default="cpu", help="cpu, or cuda (device i gets cuda:i // --devices-per-gpu)"
    )
    p.add_argument(
        "--devices-per-gpu",
        type=positive_int,
        default=1,
        help="with --device cuda and one visible GPU: K device processes on it, so that the "
        "GPU is a pool of K devices (TP, SP, PP and KV moves between its processes, over CUDA "
        "IPC; docs/serving.md, 'Several devices on one GPU')",
    )
    p.add_argument(
        "--collectives",
        choices=COLLECTIVES,
        default="auto",
        help="what carries a TP group's collectives: auto (shared memory between CPU devices "
        "and between processes sharing a GPU, NCCL on a GPU of its own), dist "
        "(torch.distributed: gloo or NCCL), shared",
    )


def resolve_devices(args: argparse.Namespace) -> list[str]:
    """Check --devices-per-gpu and --collectives; with --devices-per-gpu K on CUDA (one
    visible GPU), `args.workers` not given is K. Returns errors."""
    k, errors = args.devices_per_gpu, []
    if k > 1 and args.device != "cuda":
        errors.append("--devices-per-gpu shares a GPU between device processes (--device cuda)")
    elif k > 1:
        import torch

        gpus = torch.cuda.device_count()
        if not getattr(args, "workers_given", False):
            args.workers = k
        if gpus != 1:
            # NOTE: a group of a pool spanning two GPUs would mix both kinds of collectives;
            # a node of GPUs runs one process per GPU, over NCCL.
            errors.append(
                f"--devices-per-gpu makes one GPU a pool of devices: {gpus} are visible "
                "(CUDA_VISIBLE_DEVICES=N picks one)"
            )
        elif args.workers > k:
            errors.append(f"--workers {args.workers} with --devices-per-gpu {k}: {k} device slots")
    try:
        resolve_collectives(args.collectives, args.device, k)
    except ValueError as e:
        errors.append(f"--collectives: {e}")
    return errors
