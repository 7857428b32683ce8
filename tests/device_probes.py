"""Functions tests run inside a device process (`pool.call(d, Probe(fn, args))`); they are
picklable by reference because the device process imports this module by name."""

from __future__ import annotations

import time

import torch

from nitsum.pool.device_proc import Device
from nitsum.pool.kv_transfer import KVTransfer


def shards_share_storage(device: Device, members: tuple[int, ...]) -> bool:
    """Do the TP shard views of `members`' context share storage with the full weights?"""
    ctx, full = device.runners[members].ctx, device.model.weights.layers
    return all(
        s.qkv.untyped_storage().data_ptr() == f.qkv.untyped_storage().data_ptr()
        and s.gate_up.untyped_storage().data_ptr() == f.gate_up.untyped_storage().data_ptr()
        and s.o_t.untyped_storage().data_ptr() == f.o_t.untyped_storage().data_ptr()
        and s.down_t.untyped_storage().data_ptr() == f.down_t.untyped_storage().data_ptr()
        for s, f in zip(ctx.layers, full, strict=True)
    )


def slow_steps(device: Device, seconds: float) -> None:
    """Every forward of this device takes `seconds` longer (a replica lagging behind; 0:
    back to normal)."""
    for runner in device.runners.values():
        plain = runner.__dict__.pop("hidden", None)
        plain = getattr(plain, "plain", runner.hidden)
        if seconds <= 0:
            continue

        def hidden(inputs, plain=plain):
            time.sleep(seconds)
            return plain(inputs)

        hidden.plain = plain
        runner.hidden = hidden


def kv_slots(device: Device, pages: list[int], tokens: int, local_heads: int):
    """A copy of this device's K/V of the first `tokens` tokens stored in `pages` by a rank
    holding `local_heads` KV heads: (layers, 2, tokens, local_heads, head_dim)."""
    kv = device.pool.storage[:, :, pages]
    layers, hd = kv.shape[0], device.cfg.head_dim
    return kv.reshape(layers, 2, -1, local_heads, hd)[:, :, :tokens].clone()


def weight_bytes(device: Device) -> tuple[int, bool]:
    """(bytes of this device's weight tensors, whether every warm context's shards are views of
    them): one full copy serves every TP level and SP."""
    full = device.model.weights
    shared = all(
        shards_share_storage(device, members) for members in device.runners if len(members) > 1
    )
    return full.nbytes(), shared


def kv_pattern(device: Device, seed: int) -> torch.Tensor:
    """Seeded random KV of the device's storage shape, reproducible on another device."""
    g = torch.Generator().manual_seed(seed)
    storage = device.pool.storage
    return torch.randn(storage.shape, generator=g, dtype=storage.dtype)


def fill_kv(device: Device, seed: int, chunk_bytes: int = KVTransfer.CHUNK_BYTES) -> None:
    """Fill the device's KV storage with `kv_pattern(seed)`; set its transfer chunk size."""
    device.pool.storage.copy_(kv_pattern(device, seed))
    device.transfer.chunk_bytes = chunk_bytes


def kv_equal(device: Device, seed: int, src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Do our `dst` slots hold what a device filled with `seed` holds at `src` (TP-1 layout)?"""
    from nitsum_kernels.kv_pack import slot_view

    heads, hd = device.cfg.num_kv_heads, device.cfg.head_dim
    ref = slot_view(kv_pattern(device, seed), heads, hd)
    mine = slot_view(device.pool.storage, heads, hd)
    return bool(torch.equal(mine[:, :, dst], ref[:, :, src]))


def kv_of_slots(device: Device, slots: torch.Tensor) -> torch.Tensor:
    """The device's K/V at `slots` (TP-1 layout): (layers, 2, len(slots), heads, hd)."""
    from nitsum_kernels.kv_pack import slot_view

    view = slot_view(device.pool.storage, device.cfg.num_kv_heads, device.cfg.head_dim)
    return view.index_select(2, slots).clone()


def kv_source_timeout(device: Device, seconds: float) -> None:
    """How long this device waits for a peer's pages to be ready before a move fails."""
    assert device.transfer.shared is not None
    device.transfer.shared.timeout_s = seconds
