"""The device interface a PoolEngine drives: the device processes of a host (`DevicePool`) or
one device in this process (`LocalDevice`, the N = 1 case)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from nitsum.engine.step_inputs import StepInputs
    from nitsum.kv.host_tier import PageCopies
    from nitsum.kv.swap_copier import SwapProgress
    from nitsum.pool.faults import FaultPlan
    from nitsum.pool.kv_transfer import TransferStats
    from nitsum.pool.migration_plan import Piece
    from nitsum.pool.nixl_agent import Read
    from nitsum.pool.nixl_descs import KVRegion


class Devices(Protocol):
    """A pool of devices, each with the full weights, a warm context per TP level it can join
    and a KV pool. Failures surface as `DeviceError` (a step) or `TransferFailed` (a move)."""

    num_devices: int
    # NOTE: the candidate TP levels the devices were built with; the PoolEngine derives its
    # TPTopology from the same ones.
    levels: tuple[int, ...]
    # Devices whose process died, until a restart is up (pool/device_loss.py).
    down: set[int]

    def launch_step(self, members: tuple[int, ...], inputs: StepInputs) -> None:
        """Start one forward of the group `members` (every member runs it)."""
        ...

    def collect_step(self, members: tuple[int, ...]) -> torch.Tensor:
        """The launched step's float32 logits of the sampled rows (from the group leader)."""
        ...

    def start_swap(
        self, members: tuple[int, ...], ticket: int, out: PageCopies, into: PageCopies
    ) -> None:
        """Start copying (device page, host page) pairs `out` to each member's host KV tier,
        then (host page, device page) pairs `into` back, on each member's copy thread
        (kv/swap_copier.py); `ticket` is greater than every earlier one. Returns at once."""
        ...

    def swap_progress(self, members: tuple[int, ...], wait_for: int | None = None) -> SwapProgress:
        """The last ticket every member finished and what finished since the last call; with
        `wait_for`, once that ticket is done."""
        ...

    def migrate(
        self, pieces: list[Piece], mode: str = "pipelined", faults: FaultPlan | None = None
    ) -> list[TransferStats]:
        """Move KV pieces between (or within) devices; all or nothing (TransferFailed)."""
        ...

    def kv_out(self, pieces: list[Piece]) -> list[torch.Tensor]:
        """Pack the pieces into CPU blocks (layers, 2, tokens, heads, head_dim), each from
        its `src` device, in order (kv_wire.py: KV leaving for another host)."""
        ...

    def kv_in(self, pieces: list[Piece], blocks: list[torch.Tensor]) -> None:
        """Unpack each block into its piece's `dst` device (KV from another host)."""
        ...

    def nixl_open(self) -> list[tuple[bytes, KVRegion]]:
        """Register every device's KV pages with a NIXL agent of its own (once); each one's
        (agent metadata, region), by device (nixl_endpoint.py: KV between hosts)."""
        ...

    def nixl_connect(self, metadata: list[bytes]) -> None:
        """Every device loads these peer agents' metadata."""
        ...

    def nixl_read(self, reads: dict[int, list[Read]], timeout_s: float) -> int:
        """Each device runs its READs (device -> READs) into its pages; the bytes read.
        TransferFailed when one fails or is late (every device is drained first)."""
        ...

    def close(self) -> None:
        """Stop the devices (processes, if any)."""
        ...
