"""One device's process: full weights, warm TP contexts, KV storage; executes commands.

The controller (see device_pool.py) sends pickled commands over a pipe; the device runs
forwards under the named group's context, KV transfers, and context activations.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from nitsum.config import ModelConfig
from nitsum.engine.build import EngineConfig, build_model
from nitsum.kernels.kv_pack import slot_view
from nitsum.kv.pool import KVPool
from nitsum.parallel.comm_pool import CommPool
from nitsum.parallel.context import TPContext, build_context
from nitsum.parallel.topology import TPTopology
from nitsum.pool.kv_transfer import KVTransfer, TransferFailed


@dataclass
class ModelSource:
    """Where a device gets its full weight copy: an HF dir, or tensors (tests)."""

    model_dir: str | None = None
    hf_config: dict[str, Any] | None = None
    state_dict: dict[str, torch.Tensor] | None = None

    def load(self) -> tuple[ModelConfig, Iterable[tuple[str, torch.Tensor]]]:
        if self.model_dir is not None:
            from nitsum.weights.hf import iter_hf_tensors, load_hf_config

            return ModelConfig.from_hf(load_hf_config(self.model_dir)), iter_hf_tensors(
                self.model_dir
            )
        assert self.hf_config is not None and self.state_dict is not None
        return ModelConfig.from_hf(self.hf_config), self.state_dict.items()


@dataclass
class DeviceSpec:
    world: int
    levels: tuple[int, ...]
    ecfg: EngineConfig
    num_pages: int
    init_method: str
    threads: int = 1


class Device:
    """State of one device process."""

    def __init__(self, device: int, spec: DeviceSpec, source: ModelSource) -> None:
        self.device = device
        backend = "nccl" if spec.ecfg.device.startswith("cuda") else "gloo"
        dist.init_process_group(
            backend, init_method=spec.init_method, rank=device, world_size=spec.world
        )
        cfg, tensors = source.load()
        self.cfg = cfg
        topology = TPTopology.of(cfg, spec.world, spec.levels)
        self.comms = CommPool(topology)
        self.model = build_model(cfg, tensors, spec.ecfg)
        self.pool = KVPool(
            cfg, spec.num_pages, spec.ecfg.page_tokens, spec.ecfg.dtype, spec.ecfg.device
        )
        # NOTE: every context this device can ever join is built here, before serving.
        self.contexts: dict[tuple[int, ...], TPContext] = {}
        for tp in topology.levels:
            members = topology.group_of(device, tp)
            if members[-1] < spec.world:
                self.contexts[members] = build_context(
                    cfg,
                    self.model.weights,
                    tp,
                    members.index(device),
                    members,
                    self.comms.get(members),
                )
        self.active = self.contexts[(device,)]
        self.transfer = KVTransfer(self.pool.storage, cfg.num_kv_heads, cfg.head_dim, device)

    def _pattern(self, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(self.pool.storage.shape, generator=g, dtype=self.pool.storage.dtype)

    def handle(self, cmd: str, args: tuple) -> Any:
        if cmd == "step":
            members, inputs = args
            ctx = self.contexts[members]
            dev = self.model.weights.embed.device
            ids, pos = inputs.input_ids.to(dev), inputs.positions.to(dev)
            hidden = self.model.forward(ctx, ids, pos, inputs.meta.to(dev), self.pool)
            return self.model.logits(hidden[inputs.sample_rows]).cpu() if ctx.rank == 0 else None
        if cmd == "activate":
            t0 = time.perf_counter()
            self.active = self.contexts[args[0]]
            return time.perf_counter() - t0
        if cmd == "migrate":
            pieces, mode, fail = args
            return self.transfer.run(pieces, mode, fail)
        if cmd == "bulk":
            peer, nbytes, sending = args
            buf = (
                self.transfer.buffers[0]
                if nbytes <= self.transfer.chunk_bytes
                else torch.empty(
                    nbytes // self.pool.storage.element_size(), dtype=self.pool.storage.dtype
                )
            )
            t0 = time.perf_counter()
            (dist.send if sending else dist.recv)(buf, peer)
            return time.perf_counter() - t0
        if cmd == "read_kv":
            members, slots = args
            ctx = self.contexts[members]
            return torch.stack(
                [
                    torch.stack(self.pool.kv(layer, ctx.heads.kv_heads))
                    for layer in range(self.cfg.num_layers)
                ]
            )[:, :, slots].clone()
        if cmd == "fill_kv":
            # Benchmarks/tests: deterministic random KV, reproducible on another device.
            self.pool.storage.copy_(self._pattern(args[0] if args else 0))
            return None
        if cmd == "kv_equal":
            # Do our dst slots hold what a device filled with `seed` holds at src slots (TP 1)?
            seed, src, dst = args
            ref = slot_view(self._pattern(seed), self.cfg.num_kv_heads, self.cfg.head_dim)
            mine = slot_view(self.pool.storage, self.cfg.num_kv_heads, self.cfg.head_dim)
            return bool(torch.equal(mine[:, :, dst], ref[:, :, src]))
        if cmd == "stats":
            return {
                "groups_created": CommPool.created,
                "contexts": sorted(self.contexts),
                "all_reduce": sum(c.stats["all_reduce"] for c in self.contexts.values()),
                "storage_ptr": self.pool.storage.data_ptr(),
            }
        if cmd == "shard_storage":
            # For tests: do the active shard views share storage with the full weights?
            members = args[0]
            ctx, full = self.contexts[members], self.model.weights.layers
            return all(
                s.qkv.untyped_storage().data_ptr() == f.qkv.untyped_storage().data_ptr()
                and s.gate_up.untyped_storage().data_ptr() == f.gate_up.untyped_storage().data_ptr()
                and s.o_t.untyped_storage().data_ptr() == f.o_t.untyped_storage().data_ptr()
                and s.down_t.untyped_storage().data_ptr() == f.down_t.untyped_storage().data_ptr()
                for s, f in zip(ctx.layers, full, strict=True)
            )
        raise ValueError(f"unknown device command {cmd!r}")


def device_main(device: int, spec: DeviceSpec, source: ModelSource, conn: Connection) -> None:
    """Process entry point: build the device, then serve commands until 'stop'."""
    torch.set_num_threads(spec.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
    try:
        dev = Device(device, spec, source)
        conn.send_bytes(pickle.dumps(("ok", sorted(dev.contexts))))
    except Exception:  # noqa: BLE001 - report start-up failures to the controller
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        return
    while True:
        cmd, args = pickle.loads(conn.recv_bytes())
        if cmd == "stop":
            break
        try:
            with torch.inference_mode():
                reply = ("ok", dev.handle(cmd, args))
        except TransferFailed as e:
            reply = ("transfer_failed", str(e))
        except Exception:  # noqa: BLE001 - a bad command must not kill the device
            reply = ("error", traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply))
    dist.destroy_process_group()
