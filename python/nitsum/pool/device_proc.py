"""One device's process: full weights, warm TP contexts, KV storage; executes commands.

The controller (see device_pool.py) sends pickled commands (device_commands.py) over a pipe;
the device runs
forwards under the named group's warm context (naming the group is what switches TP: nothing
is activated or built on the switch path) and KV transfers.
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from nitsum.config import ModelConfig
from nitsum.engine.device_build import DeviceBuild
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.graphs import DecodeGraphs
from nitsum.engine.load import load_model
from nitsum.engine.piecewise import PiecewiseGraphs
from nitsum.engine.runner import ModelRunner
from nitsum.kv.swap_copier import SwapCopier
from nitsum.parallel import shared_memory
from nitsum.parallel.communicators import Communicators, resolve_collectives, world_backend
from nitsum.parallel.context import build_context
from nitsum.parallel.pipeline import DEFAULT_PP_LEVELS, build_stage
from nitsum.parallel.shared_channel import SharedChannel
from nitsum.parallel.topology import GroupShape, TPTopology
from nitsum.pool.device_commands import (
    Counters,
    DeviceCommand,
    KvIn,
    KvOut,
    Migrate,
    NixlConnect,
    NixlOpen,
    NixlRead,
    Probe,
    Reply,
    Step,
    Stop,
    SwapPoll,
    SwapStart,
)
from nitsum.pool.kv_transfer import KVTransfer, TransferFailed
from nitsum.pool.kv_wire import pack_pieces, unpack_pieces
from nitsum.pool.nixl_endpoint import KVEndpoint
from nitsum.pool.shared_kv import SharedKV

# Pipeline activations go through staging buffers of this size where collectives are shared.
PIPELINE_CHUNK_BYTES = 8 << 20
Shareable = TypeVar("Shareable", SharedKV, SharedChannel)


@dataclass
class ModelSource:
    """Where a device gets its full weight copy: an HF dir, or tensors (tests)."""

    model_dir: str | None = None
    hf_config: dict[str, Any] | None = None
    state_dict: dict[str, torch.Tensor] | None = None

    def load(self) -> tuple[ModelConfig, Iterable[tuple[str, torch.Tensor]]]:
        if self.model_dir is not None:
            return load_model(self.model_dir)
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
    pp_levels: tuple[int, ...] = DEFAULT_PP_LEVELS
    # A device restarted alone after its process died (pool/device_pool.py `restart`): a
    # world of its own (the old one cannot be rejoined), so TP 1 only and no KV transfers.
    solo: bool = False


class Device:
    """State of one device process."""

    def __init__(self, device: int, spec: DeviceSpec, source: ModelSource) -> None:
        self.device = device
        ecfg = spec.ecfg
        cuda = ecfg.device.startswith("cuda")  # the same on every rank: no handshake
        kind = resolve_collectives(
            ecfg.collectives, "cuda" if cuda else "cpu", ecfg.devices_per_gpu
        )
        if cuda:
            # NOTE: devices_per_gpu device processes share each GPU: device r runs on GPU
            # r // devices_per_gpu, its current device (Triton launches, CUDA graph capture
            # and NCCL all use the current device).
            gpu = device // ecfg.devices_per_gpu
            spec = replace(spec, ecfg=replace(ecfg, device=f"cuda:{gpu}"))
            torch.cuda.set_device(gpu)
        # NOTE: a solo device is rank 0 of a world of one; its one context still answers to
        # its pool-wide group `(device,)`, the name the controller's steps use.
        rank = 0 if spec.solo else device
        if spec.solo:
            spec = replace(spec, world=1, levels=(1,))
        backend = world_backend("cuda" if cuda else "cpu", kind)
        dist.init_process_group(
            backend, init_method=spec.init_method, rank=rank, world_size=spec.world
        )
        cfg, tensors = source.load()
        self.cfg = cfg
        topology = TPTopology.of(cfg, spec.world, spec.levels)
        storage_device = torch.device(spec.ecfg.device)
        self.comms = Communicators(topology, rank, kind, storage_device)
        # NOTE: pages are read in place between CPU devices and between processes sharing a
        # GPU; between GPUs of their own, NCCL moves them peer to peer (torch's CUDA IPC would
        # open a context on every peer GPU in every process).
        shareable = spec.world > 1 and shared_memory.supported() and (not cuda or kind == "shared")
        built = DeviceBuild(cfg, tensors, spec.ecfg, spec.num_pages, shared_kv=shareable)
        self.model, self.pool = built.model, built.kv
        # Every peer's KV pages mapped (None: KV moves over the world process group), and,
        # where collectives are shared, this device's staging for pipeline activations.
        shared_kv = None
        if built.kv_memory is not None:
            shared_kv = SharedKV(built.kv_memory, self.pool.storage)
        shared_kv = self._share(spec, shared_kv)
        if cuda and kind == "shared" and spec.world > 1 and shared_kv is None:
            # NOTE: gloo, the world group here, cannot send CUDA tensors: no fallback.
            raise RuntimeError("processes sharing a GPU move KV through CUDA IPC, which failed")
        channel = None
        if kind == "shared" and spec.world > 1:
            elems = PIPELINE_CHUNK_BYTES // self.pool.storage.element_size()
            storage = self.pool.storage
            channel = SharedChannel(device, elems, storage.dtype, storage.device)
            if self._share(spec, channel) is None:
                raise RuntimeError("shared collectives need every device's staging mapped")
        # NOTE: every context this device can ever join is built here, before serving.
        self.runners: dict[tuple[int, ...], ModelRunner] = {}
        for tp in topology.levels:
            members = topology.group_of(rank, tp).members
            if members[-1] < spec.world:
                ctx = build_context(
                    cfg, self.model.weights, tp, members.index(rank), members,
                    self.comms.get(members),
                )  # fmt: skip
                self.runners[(device,) if spec.solo else members] = built.runner(ctx)
        # Pipelines (parallel/pipeline.py) by shape: stages of TP groups above.
        self.pipelines: dict[GroupShape, ModelRunner] = {}
        for shape in [] if spec.solo else topology.pipelines(cfg.num_layers, spec.pp_levels):
            members, tp = shape.members, shape.tp
            if device in members:
                stage = build_stage(cfg.num_layers, tp, members, device, channel)
                assert stage is not None
                i = members.index(device)
                tp_group = members[i - i % tp : i - i % tp + tp]
                comm = self.comms.get(tp_group)
                ctx = build_context(cfg, self.model.weights, tp, i % tp, members, comm, stage)
                self.pipelines[shape] = built.runner(ctx, graphs=False)
        self.transfer = KVTransfer(
            self.pool.storage, cfg.num_kv_heads, cfg.head_dim, device, shared=shared_kv
        )
        # The host tier's copy thread, shared by every context (None: no host tier).
        self.copier = SwapCopier(built.host) if built.host is not None else None
        # The KV pages' NIXL agent, once the host worker joins a NIXL transport (NixlOpen).
        self.nixl: KVEndpoint | None = None

    def _share(self, spec: DeviceSpec, mine: Shareable | None) -> Shareable | None:
        """`mine` with every peer's mapped (`attach`), where every device has one and maps
        all the others; else None on every device (then they all use the world process
        group).

        NOTE: collective over the world group: every device calls it, in the same order, at
        start-up.
        """
        handles: list[Any] = [None] * spec.world
        dist.all_gather_object(handles, mine.handle() if mine is not None else None)
        if mine is None or any(h is None for h in handles):
            return None
        try:
            mine.attach(dict(enumerate(handles)))
            ok = torch.ones(1)
        except (OSError, RuntimeError):  # torch.from_file and CUDA IPC raise RuntimeError
            ok = torch.zeros(1)
        # All map their peers, or none uses them. (On NCCL the flag goes through the GPU.)
        if dist.get_backend() == "nccl":
            ok = ok.to(self.pool.storage.device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return mine if ok.item() == 1 else None

    def handle(self, cmd: DeviceCommand) -> Any:
        """Serve one command of the controller (`DevicePool`)."""
        match cmd:
            case Step(members, inputs):
                if inputs.stage_tp:
                    runner = self.pipelines[GroupShape.pipeline(members, inputs.stage_tp)]
                else:
                    runner = self.runners[members]
                if not runner.ctx.samples:
                    runner.join(inputs)  # one rank samples; the others join its collectives
                    return None
                return runner.forward(inputs).cpu()
            case SwapStart(ticket, out, into):
                return self._copier().start(ticket, out, into)
            case SwapPoll(wait_for):
                return self._copier().progress(wait_for)
            case Migrate(pieces, mode, faults, migration):
                return self.transfer.run(pieces, mode, faults, migration)
            case KvOut(pieces):
                return pack_pieces(self.transfer, pieces)
            case KvIn(pieces, blocks):
                return unpack_pieces(self.transfer, pieces, blocks)
            case NixlOpen():
                self.nixl = self.nixl or KVEndpoint.of(self.transfer)
                return self.nixl.info()
            case NixlConnect(metadata):
                return self._nixl().connect(metadata)
            case NixlRead(reads, timeout_s):
                return self._nixl().read(reads, timeout_s)
            case Counters():
                return self.counters()
            case Probe(fn, args):
                return fn(self, *args)
        raise ValueError(f"unknown device command {cmd!r}")

    def _nixl(self) -> KVEndpoint:
        if self.nixl is None:
            raise RuntimeError(f"device {self.device} has no NIXL agent (NixlOpen first)")
        return self.nixl

    def _copier(self) -> SwapCopier:
        if self.copier is None:
            raise RuntimeError(f"device {self.device} has no host KV tier")
        return self.copier

    def counters(self) -> dict[str, Any]:
        """Collectives run, graph captures and replays, contexts and pipelines built."""
        return {
            "collectives": self.comms.kind,
            "groups_created": Communicators.created,
            "contexts": sorted(self.runners),
            "all_reduce": sum(r.ctx.stats["all_reduce"] for r in self.runners.values()),
            "all_to_all": sum(
                r.ctx.sp.stats["all_to_all"] for r in self.runners.values() if r.ctx.sp
            ),
            "storage_ptr": self.pool.storage.data_ptr(),
            "graph_captures": DecodeGraphs.captures,
            "graph_replays": sum(
                r.graphs.replays for r in self.runners.values() if r.graphs is not None
            ),
            "piecewise_captures": PiecewiseGraphs.captures,
            "graph_cuts": sum(
                rec.cuts
                for r in self.runners.values()
                for rec in (r.graphs, r.piecewise)
                if rec is not None
            ),
            "piecewise_replays": sum(
                r.piecewise.replays for r in self.runners.values() if r.piecewise is not None
            ),
            "pipelines": sorted((s.members, s.tp) for s in self.pipelines),
            "p2p_sends": sum(
                r.ctx.stage.stats["p2p_sends"] for r in self.pipelines.values() if r.ctx.stage
            ),
        }


def device_main(device: int, spec: DeviceSpec, source: ModelSource, conn: Connection) -> None:
    """Process entry point: build the device, then serve commands until `Stop`."""
    torch.set_num_threads(spec.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
    try:
        Communicators.guard_group_creation()  # this process is only a device
        dev = Device(device, spec, source)
        DecodeGraphs.freeze()  # a switch selects recorded steps; it never records
        conn.send_bytes(pickle.dumps(Reply("ok", sorted(dev.runners))))
    except Exception:  # noqa: BLE001 - report start-up failures to the controller
        conn.send_bytes(pickle.dumps(Reply("error", traceback.format_exc())))
        return
    while True:
        cmd: DeviceCommand = pickle.loads(conn.recv_bytes())
        if isinstance(cmd, Stop):
            if dev.copier is not None:
                dev.copier.close()
            break
        try:
            with torch.inference_mode():
                reply = Reply("ok", dev.handle(cmd))
        except TransferFailed as e:
            reply = Reply("transfer_failed", str(e))
        except Exception:  # noqa: BLE001 - a bad command must not kill the device
            reply = Reply("error", traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply))
    dist.destroy_process_group()
