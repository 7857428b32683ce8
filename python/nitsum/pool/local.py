"""One device in this process: the N = 1 case of a device pool.

`LocalDevice` has DevicePool's interface (launch/collect a step, migrate, close), so
the offline API (`nitsum.LLM`), a one-device worker and a host worker of N device processes
all run the same engine path: a PoolEngine over a pool. TP is runtime state there too: the
device's TP-1 context is the one level a pool of one device has.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from nitsum.config import ModelConfig
from nitsum.engine.device_build import DeviceBuild, pages_for_config
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.load import install_grammars, load_model, model_eos_ids
from nitsum.engine.overlap import enable_overlap, overlap_wanted
from nitsum.engine.step_inputs import StepInputs
from nitsum.kv.host_tier import PageCopies
from nitsum.kv.swap_copier import SwapProgress
from nitsum.parallel.context import build_context
from nitsum.parallel.topology import GroupShape
from nitsum.pool.device_pool import DeviceError
from nitsum.pool.faults import FaultPlan
from nitsum.pool.kv_transfer import KVTransfer, TransferFailed, TransferStats
from nitsum.pool.kv_wire import pack_pieces, unpack_pieces
from nitsum.pool.migration_plan import Piece
from nitsum.pool.nixl_agent import Read
from nitsum.pool.nixl_descs import KVRegion
from nitsum.pool.nixl_endpoint import KVEndpoint
from nitsum.pool.pool_engine import PoolEngine

ONLY_GROUP = GroupShape.tp_group((0,))


class LocalDevice:
    """A pool of one device, in this process: the full weights, the KV pool and the TP-1
    context. A step runs when it is collected."""

    num_devices = 1

    def __init__(
        self,
        cfg: ModelConfig,
        tensors: Iterable[tuple[str, torch.Tensor]],
        ecfg: EngineConfig,
        num_pages: int,
    ) -> None:
        self.levels: tuple[int, ...] = (1,)
        self.down: set[int] = set()  # NOTE: it dies only with this process
        device = DeviceBuild(cfg, tensors, ecfg, num_pages)
        ctx = build_context(cfg, device.model.weights, 1, 0)
        self.runner = device.runner(ctx, swaps=True)
        # Packs and unpacks KV leaving for / coming from another host worker (kv_wire.py).
        storage = device.kv.storage
        self.transfer = KVTransfer(storage, cfg.num_kv_heads, cfg.head_dim, 0, chunk_bytes=0)
        self._launched: StepInputs | None = None
        self.nixl: KVEndpoint | None = None  # its pages' NIXL agent (`nixl_open`)

    def launch_step(self, members: tuple[int, ...], inputs: StepInputs) -> None:
        if members != ONLY_GROUP.members or self._launched is not None:
            raise DeviceError(f"device 0: cannot launch a step of {members}")
        self._launched = inputs

    def collect_step(self, members: tuple[int, ...]) -> torch.Tensor:
        """Float32 logits of the sampled rows; DeviceError if the forward failed."""
        inputs, self._launched = self._launched, None
        if members != ONLY_GROUP.members or inputs is None:
            raise DeviceError(f"device 0: no step of {members} was launched")
        try:
            with torch.inference_mode():
                return self.runner.forward(inputs)
        except Exception as e:  # noqa: BLE001 - a failing step fails its group, not the worker
            raise DeviceError(f"{type(e).__name__}: {e}") from e

    def start_swap(
        self, members: tuple[int, ...], ticket: int, out: PageCopies, into: PageCopies
    ) -> None:
        self._check(members)
        self.runner.start_swap(ticket, out, into)

    def swap_progress(self, members: tuple[int, ...], wait_for: int | None = None) -> SwapProgress:
        self._check(members)
        return self.runner.swap_progress(wait_for)

    @staticmethod
    def _check(members: tuple[int, ...]) -> None:
        if members != ONLY_GROUP.members:
            raise DeviceError(f"device 0: no group {members}")

    def migrate(
        self, pieces: list[Piece], mode: str = "pipelined", faults: FaultPlan | None = None
    ) -> list[TransferStats]:
        # NOTE: one device has one group, so no sequence ever changes layout.
        if pieces:
            raise TransferFailed("a pool of one device has nowhere to move KV")
        return []

    def kv_out(self, pieces: list[Piece]) -> list[torch.Tensor]:
        for p in pieces:
            self._check((p.src,))
        return pack_pieces(self.transfer, pieces)

    def kv_in(self, pieces: list[Piece], blocks: list[torch.Tensor]) -> None:
        for p in pieces:
            self._check((p.dst,))
        unpack_pieces(self.transfer, pieces, blocks)

    def nixl_open(self) -> list[tuple[bytes, KVRegion]]:
        self.nixl = self.nixl or KVEndpoint.of(self.transfer)
        return [self.nixl.info()]

    def nixl_connect(self, metadata: list[bytes]) -> None:
        self._endpoint().connect(metadata)

    def nixl_read(self, reads: dict[int, list[Read]], timeout_s: float) -> int:
        if set(reads) - {0}:
            raise DeviceError(f"device 0: no devices {sorted(set(reads) - {0})}")
        return self._endpoint().read(reads.get(0, []), timeout_s)

    def _endpoint(self) -> KVEndpoint:
        if self.nixl is None:
            raise DeviceError("device 0 has no NIXL agent (nixl_open first)")
        return self.nixl

    def close(self) -> None:
        """Stop the copy thread and the NIXL agent's (no processes)."""
        if self.runner.copier is not None:
            self.runner.copier.close()
        if self.nixl is not None:
            self.nixl.agent.close()

    def __enter__(self) -> LocalDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def local_engine(
    cfg: ModelConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    ecfg: EngineConfig | None = None,
    eos_token_ids: tuple[int, ...] | None = None,
) -> PoolEngine:
    """A PoolEngine over one in-process device (its one group is TP 1)."""
    ecfg = ecfg or EngineConfig()
    num_pages = pages_for_config(cfg, ecfg)
    device = LocalDevice(cfg, tensors, ecfg, num_pages)
    pe = PoolEngine(device, cfg, ecfg, num_pages, [ONLY_GROUP], eos_token_ids)
    if overlap_wanted(ecfg.device, ecfg.overlap):
        # NOTE: its one group is never reshaped or bound, so the engine stays this one.
        enable_overlap(pe.engines[ONLY_GROUP], device.runner)
    return pe


def open_local_engine(model_dir: str | Path, ecfg: EngineConfig | None = None) -> PoolEngine:
    """`local_engine` on the HF model directory `model_dir`."""
    cfg, tensors = load_model(model_dir)
    eos = model_eos_ids(Path(model_dir))
    install_grammars(Path(model_dir), eos)
    return local_engine(cfg, tensors, ecfg, eos)
