"""The engine of a whole device pool: one local scheduler per TP group, and TP switching.

`reconfigure` is a transaction (ReMP §3.9): plan → allocate new pages → transfer →
commit (the last three in `kv_move.py`). Until commit every running request keeps its old
pages, layout and group, so a failed transfer just releases the new pages and the pool
carries on as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from nitsum.config import ModelConfig
from nitsum.engine.engine import Engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_output import RequestOutput
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduler import Scheduler
from nitsum.engine.swap import SwapSpace
from nitsum.errors import InvalidRequestError
from nitsum.kv.cache import KVCache
from nitsum.kv.host_tier import host_pages_in
from nitsum.kv.pages import PageAllocator
from nitsum.parallel.pipeline import DEFAULT_PP_LEVELS
from nitsum.parallel.topology import GroupShape, TPTopology
from nitsum.pool import page_usage
from nitsum.pool.binding import Binder
from nitsum.pool.devices import Devices
from nitsum.pool.faults import FaultPlan
from nitsum.pool.group_runner import GroupRunner
from nitsum.pool.group_step import InFlight, collect_all, step_groups
from nitsum.pool.kv_move import ReconfigureReport
from nitsum.pool.pd_handoff import hand_off_prefilled
from nitsum.pool.switch import Switch

if TYPE_CHECKING:
    import nitsum._core as _core


class PoolEngine:
    """Serves requests on TP groups of a pool of devices and switches TP between steps."""

    def __init__(
        self,
        pool: Devices,
        cfg: ModelConfig,
        ecfg: EngineConfig,
        num_pages: int,
        groups: list[GroupShape],
        eos_token_ids: tuple[int, ...] | None = None,
    ) -> None:
        """`groups`: the first plan's TP groups (pipelines come with `reconfigure`)."""
        self.pool = pool
        self.cfg = cfg
        self.ecfg = ecfg
        self.eos = eos_token_ids
        self.topology = TPTopology.of(cfg, pool.num_devices, pool.levels)
        self.allowed = self.topology.levels
        self.alloc = PageAllocator(pool.num_devices, num_pages, ecfg.page_tokens, cfg.num_kv_heads)
        # The host KV tier's pages (every device has as many; kv/host_tier.py), if any.
        self.page_bytes = KVCache.page_bytes_of(cfg, ecfg.page_tokens, ecfg.dtype)
        host_pages = host_pages_in(ecfg.host_kv_cache_bytes, self.page_bytes)
        self.host_alloc = (
            PageAllocator(pool.num_devices, host_pages, ecfg.page_tokens, cfg.num_kv_heads)
            if host_pages
            else None
        )
        self.topology.check(groups)
        self.decode_targets: dict[str, GroupShape] = {}
        # Cumulative counters, reported to the router in `stats` messages (`/metrics`).
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "kv_handoffs",
                "kv_handoff_bytes",
                "reconfigurations",
                "kv_migrated_bytes",
                "sp_steps",
                "tp_steps",
                "pp_steps",
            ),
            0,
        )
        # NOTE: keyed by shape, and `engines[g].shape == g` (a plan's groups are disjoint).
        self.engines: dict[GroupShape, Engine] = {g: self.new_engine(g) for g in groups}
        # `Engine.counters` of engines already dissolved.
        self.retired: Counter[str] = Counter()
        # Per-request TP bindings borrowing the plan's groups (pool/binding.py).
        self.binder = Binder(self)
        # The last reconfigurations: outcome, preemptions and phase timings (pool/switch.py).
        self.switch_log: list[dict] = []
        # Devices that serve only as TP-1 groups of their own: lost or restarted alone
        # (pool/device_loss.py).
        self.solo: set[int] = set()
        # Steps still in flight after an iteration (a late group: pool/group_step.py), and the
        # outputs of steps collected outside `step` (`settle`), for the next `step` to return.
        self.carry: dict[GroupShape, InFlight] = {}
        self.early: list[RequestOutput] = []

    def new_engine(self, shape: GroupShape) -> Engine:
        """A new engine for the group `shape` (its pages, host pages and runner)."""
        pages = self.alloc.group(shape.members, shape.tp)
        e = self.ecfg
        swap = None
        if self.host_alloc is not None:
            host = self.host_alloc.group(shape.members, shape.tp)
            swap = SwapSpace(host, pages, self.page_bytes, e.swap_mode)
        scheduler = Scheduler(
            pages, e.max_batch, e.token_budget, e.overtaking, e.prefix_caching, swap
        )
        runner = GroupRunner(self.pool, shape, pages, e.shift, self.counters)
        return Engine(self.cfg, runner, scheduler, self.ecfg.max_context, self.eos)

    def check_shapes(self, shapes: list[GroupShape]) -> None:
        """ValueError unless `shapes` are disjoint groups with warm contexts on their devices:
        aligned TP groups of allowed levels, or pipelines the topology lists."""
        self.topology.check([s for s in shapes if not s.is_pipeline])
        known = set(self.topology.pipelines(self.cfg.num_layers, DEFAULT_PP_LEVELS))
        seen: set[int] = set()
        for s in shapes:
            if s.is_pipeline and s not in known:
                raise ValueError(
                    f"no pipeline {s}: stages must be allowed TP levels, depth in "
                    f"{DEFAULT_PP_LEVELS} and at most the {self.cfg.num_layers} layers, on an "
                    "aligned block"
                )
            if seen & set(s.members):
                raise ValueError(f"group {s.members} overlaps another group")
            if s.size > 1 and set(s.members) & self.solo:
                raise ValueError(
                    f"group {s.members}: device(s) {sorted(set(s.members) & self.solo)} "
                    "restarted alone after a crash serve as TP-1 groups only"
                )
            seen |= set(s.members)

    @property
    def groups(self) -> list[GroupShape]:
        """The plan's groups, in the order their engines were made."""
        return list(self.engines)

    def every_engine(self) -> list[tuple[GroupShape, Engine]]:
        """The plan's engines and the bindings' (whose devices overlap them)."""
        return [*self.engines.items(), *self.binder.engines()]

    @property
    def last_bind(self) -> _core.BindDecision | None:
        """The cost model's most recent decision (`BindingModel.decide`'s), if any."""
        return self.binder.chooser.last

    def max_servable_tokens(self) -> int:
        """The longest context (prompt + output) the pool's KV can hold: a page holds more
        tokens at a higher TP, so a group of the largest level holds the most."""
        return self.alloc.num_pages * self.alloc.tokens_per_page(max(self.allowed))

    # -- requests ----------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        spec: RequestSpec,
        group: GroupShape | None = None,
        decode_group: GroupShape | None = None,
    ) -> GroupShape:
        """Queue on `group` (default: the group with the fewest requests); returns the group
        it runs on.

        With `decode_group`, `group` only prefills: once the prompt is done and the first token
        sampled, the request's KV moves to `decode_group`, which decodes the rest.
        A request runs on a TP group bound for it (pool/binding.py) when it asks for one
        (`spec.bind_tp`: its tier's) or when its prompt and `max_tokens` do not fit one
        `group`'s KV; the binding is hard (`spec.bind_hard`; default: when it has a TTFT
        target) or soft, weighed first by the cost model unless the context needs it
        (pool/bind_choice.py). `spec.fork_of`: a sibling choice sharing its prefill.
        """
        if decode_group is not None and decode_group not in self.engines:
            raise ValueError(f"decode group {decode_group} is not a current group")
        if any(request_id in e.request_ids() for _, e in self.every_engine()):
            raise ValueError(f"request {request_id!r} is already running")
        if group is None:
            group = min(self.engines, key=lambda g: len(self.engines[g].request_ids()))
        engine = self.engines[group]
        prompt_ids = spec.prompt(prompt_ids)
        if len(prompt_ids) >= self.max_servable_tokens():
            raise InvalidRequestError(
                "prompt",
                f"has {len(prompt_ids)} tokens; the largest TP group's KV holds "
                f"{self.max_servable_tokens()} and at least one token must be generated",
            )
        context = min(len(prompt_ids) + spec.sampling.max_tokens, engine.max_context)
        deadline = spec.ttft_ms is not None
        tp, need = self.binder.levels(group, context, spec.bind_tp, deadline)
        # NOTE: a pipeline is never a binding's replica (bindings merge TP groups); a request
        # its pages cannot hold is refused by its engine with the pages it needs.
        # NOTE: never a binding over a device restarted alone (pool/device_loss.py).
        bigger = tp > group.tp
        lone = set(self.topology.group_of(group.leader, tp).members) & self.solo if bigger else None
        if bigger and not group.is_pipeline and not lone:
            tokens, needed = (len(prompt_ids), context - len(prompt_ids)), need > group.tp
            group, engine = self.binder.serve(tp, group, request_id, spec, tokens, needed)
        try:
            engine.add_request(request_id, prompt_ids, spec)
        except InvalidRequestError:
            self.binder.drop(request_id)
            self.binder.release()  # a binding made for it alone is undone
            raise
        self.binder.admitted(request_id)
        if decode_group is not None:
            self.decode_targets[request_id] = decode_group
        return group

    def abort(self, request_id: str) -> bool:
        """Take a request out (freeing its pages), even if its engine is upset."""
        if any(request_id == i.seq.request_id for f in self.carry.values() for i in f.batch):
            self.settle()  # NOTE: no page is freed while a step in flight writes it
        self.decode_targets.pop(request_id, None)
        self.binder.drop(request_id)
        found = any(e.abort_or_forget(request_id) for _, e in self.every_engine())
        self.binder.release()  # NOTE: nothing may step again soon to release it
        return found

    def has_unfinished(self) -> bool:
        return bool(self.early) or any(e.has_unfinished() for _, e in self.every_engine())

    def step(self) -> list[RequestOutput]:
        """One iteration on every group; groups run concurrently on their devices
        (pool/group_step.py).

        NOTE: the plan's groups lent to a formed binding sit out; a binding forms and is
        released only here, between iterations (pool/binding.py)."""
        # NOTE: a step stays in flight across iterations only while no binding or P/D
        # hand-off moves sequences between engines.
        alone = not self.binder.bindings and not self.decode_targets
        if not alone:
            self.settle()
        self.binder.begin_iteration()
        carry = self.carry if alone else None
        outputs = self.early + step_groups(self.pool, self.engines, self.binder, carry)
        self.early = []
        for out in outputs:
            if out.finished:
                self.decode_targets.pop(out.request_id, None)
                self.binder.drop(out.request_id)
        hand_off_prefilled(self)  # P/D within the pool (pool/pd_handoff.py)
        self.binder.step_done()
        return outputs

    # -- reconfiguration ---------------------------------------------------------------------
    def reconfigure(
        self,
        groups: Iterable[GroupShape],
        mode: str = "pipelined",
        faults: FaultPlan | None = None,
    ) -> ReconfigureReport:
        """Switch the pool to `groups` at this iteration boundary, migrating running KV, as a
        transaction (pool/switch.py). `faults`: failures a test injects (None: none)."""
        self.settle()
        return Switch(self, list(groups)).run(mode, faults)

    def plan_switch(self, groups: Iterable[GroupShape]) -> list[str]:
        """The running requests a switch to `groups` would preempt for lack of pages, lowest
        priority first (the capacity check, before anything changes)."""
        self.settle()
        return Switch(self, list(groups)).capacity()

    def settle(self) -> None:
        """End every step still in flight (each by its deadline); their outputs come with
        the next `step`."""
        self.early += collect_all(self.pool, self.carry, self.binder)

    def retire(self, engine: Engine) -> None:
        """A dissolved group's engine: free its cached pages, keep its counters."""
        self.retired.update(engine.counters())
        engine.close()

    def free_pages(self, device: int) -> int:
        """Pages of `device` free now or as soon as its group needs them (idle cached ones)."""
        return page_usage.free_pages(self, device)

    def flush_prefix_cache(self) -> int:
        """Drop every engine's idle cached prefix pages (`/flush_cache`); returns the device
        pages freed over all groups."""
        return sum(engine.flush_prefix_cache() for _, engine in self.every_engine())

    def all_counters(self) -> dict[str, int]:
        """Cumulative counters for the `stats` message: the pool's own and its engines'
        (`Engine.counters`), dissolved ones included."""
        total = Counter(self.retired)
        for _, engine in self.every_engine():
            total.update(engine.counters())
        return {**self.counters, **self.binder.counters, **total, **self.usage()}

    def usage(self) -> dict[str, int]:
        """The KV gauges of `stats`: device and host-tier pages in use, percent
        (pool/page_usage.py)."""
        return page_usage.usage(self)

    def page_accounting(self) -> dict[int, tuple[set[int], set[int]]]:
        """Per device: (pages marked used, pages owned by live sequences or held by a
        group's prefix cache). Must be equal (pool/page_usage.py)."""
        return page_usage.page_accounting(self)
