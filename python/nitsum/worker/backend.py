"""What a worker process serves: a PoolEngine over its devices (one in-process device, or N
device processes), with TP switching.

The server (server.py) speaks the protocol for every device id a backend serves; the backend
owns the engines. Device ids here are the router's worker ids.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from nitsum.engine.request_output import RequestOutput
from nitsum.parallel.topology import GroupShape
from nitsum.worker.assignment import LocalPlan, PlanRefused
from nitsum.worker.bind_decision import BindDecision
from nitsum.worker.device_watch import DeviceEvents, DeviceWatch
from nitsum.worker.inbound import GenerateRequest

if TYPE_CHECKING:
    from nitsum.pool.nixl_peers import NixlPeers
    from nitsum.pool.peers import KVPeers
    from nitsum.pool.pool_engine import PoolEngine
    from nitsum.pool.remote_handoff import RemoteHandoffs

log = logging.getLogger(__name__)


class Backend(Protocol):
    """The engine side of a worker process."""

    device_ids: list[int]  # the worker ids served, ascending
    tp_levels: tuple[int, ...]
    max_batch: int  # the configured batch cap; a plan's `max_batch` may only lower it

    def capacity(self) -> tuple[int, int, list[int]]:
        """(KV tokens of one device at TP 1, max context, EOS ids) for `register`."""
        ...

    def register_shape(self, device: int) -> tuple[list[int], int]:
        """(TP levels, domain) of `device` for `register`."""
        ...

    def device_events(self) -> DeviceEvents:
        """Devices lost and restarted since the last call (worker/device_watch.py)."""
        ...

    def load(self, device: int) -> tuple[int, int, int]:
        """(running, waiting, free KV pages) of `device` for its heartbeat."""
        ...

    def add(self, device: int, req: GenerateRequest) -> None:
        """Queue `req` on the group that holds `device`; InvalidRequestError if it is bad."""
        ...

    def abort(self, request_id: str) -> None:
        """Take a request out (freeing its pages), even if the engine is upset."""
        ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def running(self) -> list[str]:
        """Ids of the requests in the batch a failed `step` was running."""
        ...

    def requests(self) -> list[str]:
        """Ids of every request the engines hold."""
        ...

    def reconfigure(self, plan: LocalPlan) -> dict[str, float]:
        """Switch to `plan` at this iteration boundary; returns timings in ms.

        Raises PlanRefused (with nothing changed) when the plan cannot be followed.
        """
        ...

    def counters(self) -> dict[str, int]:
        """Cumulative counters of the whole backend for the `stats` message ({}: none)."""
        ...

    def last_bind(self) -> BindDecision | None:
        """The most recent binding decision of the cost model, for `stats` (None: none)."""
        ...

    def flush_prefix_cache(self) -> int:
        """Drop the prefix caches' pages no request holds; returns the device pages freed."""
        ...

    def moved(self) -> tuple[list[str], list[tuple[str, int, int]]]:
        """Since the last call: ids of requests handed off to another process (they end
        there, not here), and (id, worker id, prompt tokens) of those handed to this one
        (they stream on that worker id's socket)."""
        ...


class PoolBackend:
    """A PoolEngine over the devices `first_id ..`: one engine per TP group, TP switching.

    NOTE: a generate arriving on a device that is not a leader (a router that has not switched
    its tables yet) joins the group that holds the device now, so it is never lost.
    """

    def __init__(self, pe: PoolEngine, first_id: int = 0, mode: str = "pipelined") -> None:
        self.pe = pe
        self.first_id = first_id
        self.mode = mode
        self.device_ids = [first_id + d for d in range(pe.pool.num_devices)]
        self.tp_levels = pe.allowed
        self.max_batch = pe.ecfg.max_batch
        # P/D across host worker processes (`attach_peers`); None: a decode target in another
        # process is not reachable and the request decodes here.
        self.remote: RemoteHandoffs | None = None
        # Dead device processes out, restarts back in (`watch_devices`); None: not watched.
        self.watch: DeviceWatch | None = None

    def attach_peers(self, peers: KVPeers | NixlPeers) -> None:
        """Hand KV to and take it from other host worker processes over `peers`."""
        from nitsum.pool.remote_handoff import RemoteHandoffs

        self.remote = RemoteHandoffs(self.pe, peers)

    def device_events(self) -> DeviceEvents:
        return self.watch.poll() if self.watch is not None else DeviceEvents()

    def register_shape(self, device: int) -> tuple[list[int], int]:
        if device - self.first_id in self.pe.solo:
            # NOTE: a device restarted alone is its own domain of TP 1: the router's planner
            # then puts it in no TP group and no P/D handoff with the others.
            return [1], device
        return list(self.tp_levels), self.first_id  # one process = one domain

    def _group(self, device: int) -> GroupShape:
        local = device - self.first_id
        return next(g for g in self.pe.engines if g.holds(local))

    def capacity(self) -> tuple[int, int, list[int]]:
        engine = next(iter(self.pe.engines.values()))
        tokens = self.pe.alloc.num_pages * self.pe.alloc.base_page_tokens
        # NOTE: a request longer than one device's KV runs on a bound TP group
        # (pool/binding.py), so the context served is what the largest group holds.
        context = min(engine.max_context, self.pe.max_servable_tokens())
        return tokens, context, sorted(engine.eos_token_ids)

    def load(self, device: int) -> tuple[int, int, int]:
        group = self._group(device)
        free = self.pe.free_pages(device - self.first_id)
        if group.leader != device - self.first_id:
            return 0, 0, free  # requests are counted on their group's leader only
        running, waiting, _ = self.pe.engines[group].load()
        for bound, engine in self.pe.binder.engines():
            if bound.leader == group.leader:  # a binding's requests count on its leader too
                r, w, _ = engine.load()
                running, waiting = running + r, waiting + w
        return running, waiting, free

    def add(self, device: int, req: GenerateRequest) -> None:
        group = self._group(device)
        decode, target = None, req.spec.decode_target
        if target is not None and target in self.device_ids:
            decode = self._group(target)  # P/D: KV moves there after prefill
        self.pe.add_request(
            req.request_id,
            req.input_ids,
            req.spec,
            group,
            decode_group=None if decode == group else decode,
        )
        if self.remote is not None and self.remote.wants(target):
            assert target is not None
            self.remote.add(req.request_id, target)

    def abort(self, request_id: str) -> None:
        if self.remote is not None:
            self.remote.drop(request_id)
        self.pe.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.pe.has_unfinished() or (self.remote is not None and self.remote.pending())

    def step(self) -> list[RequestOutput]:
        if self.remote is None:
            return self.pe.step()
        # NOTE: arrivals join before the step, so their next token comes in this one.
        arrived = self.remote.receive({d: self._group(d) for d in self.device_ids})
        outputs = self.pe.step() if self.pe.has_unfinished() else []
        return arrived + self.remote.ship(outputs)

    def moved(self) -> tuple[list[str], list[tuple[str, int, int]]]:
        return self.remote.moved() if self.remote is not None else ([], [])

    def running(self) -> list[str]:
        return [s.request_id for _, e in self.pe.every_engine() for s in e.running()]

    def requests(self) -> list[str]:
        return [rid for _, e in self.pe.every_engine() for rid in e.request_ids()]

    def reconfigure(self, plan: LocalPlan) -> dict[str, float]:
        down = self.pe.pool.down
        # NOTE: local_plan gives every device a group; a dead one has none until it is back.
        dead = {self.first_id + d for d in down}
        kept = [g for g in plan.groups if not (g.size == 1 and g.leader in dead)]
        plan = LocalPlan(kept, plan.assignments)
        groups = [
            GroupShape(tuple(d - self.first_id for d in g.members), g.tp, g.pp) for g in plan.groups
        ]
        if self.remote is not None:
            self.remote.settle_all()  # NOTE: an offer's pages must keep their layout
        try:
            report = self.pe.reconfigure(groups, self.mode)
        except ValueError as e:  # check_shapes: unaligned, overlapping or unsupported groups
            raise PlanRefused(str(e)) from e
        if not report.ok:  # the transfer failed and was rolled back
            raise PlanRefused(f"plan not applied, nothing changed: {report.error}")
        for local, g in zip(groups, plan.groups, strict=True):
            cap = plan.max_batch(g) or self.max_batch
            self.pe.engines[local].max_batch = min(self.max_batch, cap)
        return dict(report.timings_ms)

    def flush_prefix_cache(self) -> int:
        return self.pe.flush_prefix_cache()

    def counters(self) -> dict[str, int]:
        remote = self.remote.counters if self.remote is not None else {}
        return {**self.pe.all_counters(), **remote}

    def last_bind(self) -> BindDecision | None:
        # NOTE: `PoolEngine.last_bind` is the cost model's decision as `BindingModel.decide`
        # returned it (typed), or None (no cost model, or nothing weighed yet).
        decision = self.pe.last_bind
        return None if decision is None else BindDecision.from_core(decision)
