"""A device's end of the KV transport between hosts: its KV pages registered with a NIXL
agent of the device's own process (nixl_agent.py), which READs pieces of a peer device's
pages straight into its own (nixl_descs.py names the bytes).

The device pool (device_pool.py, local.py) opens one per device on demand (`Devices.nixl_open`)
when its host worker joins a KV transport over NIXL; nothing is registered otherwise.
"""

from __future__ import annotations

import torch

from nitsum.pool.kv_transfer import KVTransfer, TransferFailed
from nitsum.pool.nixl_agent import Agent, Read
from nitsum.pool.nixl_descs import KVRegion


class KVEndpoint:
    """A NIXL agent that registered one device's KV storage."""

    def __init__(self, storage: torch.Tensor, kv_heads: int, head_dim: int) -> None:
        """NixlUnavailable when NIXL cannot start here."""
        if not storage.is_contiguous():
            raise ValueError("KV storage must be contiguous to be registered")
        self.agent = Agent("dev")
        self.agent.register(storage)
        layers = storage.shape[0]
        self.region = KVRegion(
            agent=self.agent.name,
            addr=storage.data_ptr(),
            layers=layers,
            plane_bytes=storage[0, 0].numel() * storage.element_size(),
            itemsize=storage.element_size(),
            kv_heads=kv_heads,
            head_dim=head_dim,
            mem="VRAM" if storage.device.type == "cuda" else "DRAM",
            dev=max(storage.get_device(), 0),
        )

    @classmethod
    def of(cls, transfer: KVTransfer) -> KVEndpoint:
        """The endpoint over the storage of a device's KV transfers."""
        return cls(transfer.storage, transfer.kv_heads, transfer.head_dim)

    def info(self) -> tuple[bytes, KVRegion]:
        """(agent metadata, region) for the peers."""
        return self.agent.metadata(), self.region

    def connect(self, metadata: list[bytes]) -> None:
        self.agent.connect(metadata)

    def read(self, reads: list[Read], timeout_s: float) -> int:
        """Run the READs into this device's pages; TransferFailed if one fails or is late."""
        try:
            return self.agent.read(reads, timeout_s)
        except RuntimeError as e:
            raise TransferFailed(str(e)) from e
