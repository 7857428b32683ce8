"""Per-request TP binding (Flying Serving §2.3, §4.2, §5): DP replicas of the plan bound into
a TP group for the requests that need it, and released to DP when those finish.

The window planner owns the layout (`PoolEngine.reconfigure`); a binding only *borrows* the
plan's groups inside one aligned block of devices and gives them back, with nothing rebuilt:
every device already holds the full weights and a warm context for the bound group (the
shard views and communicators of TP switching), so binding is bookkeeping at an iteration
boundary. The replicas' requests keep their KV in their own layout: pages of every layout tag
live in one allocator, and the bound group takes only pages free on all its members.

- **Hard** (latency-oriented requests): the replicas stop at once; their running requests
  pause with their KV intact and resume after release (nothing recomputed).
- **Soft** (throughput-oriented, or a long context without a TTFT target): the group forms
  at once and *alternates* iterations with its replicas (`bind_soft_yields` counts the
  replicas' turns): the replicas keep their batches and are paused only on the bound
  group's iterations.

Whether a tier's `bind_tp` or the load trigger binds at all is the cost model's call
(pool/bind_choice.py): in full, for the prompt only (the KV then goes back to a replica,
pool/bind_handback.py), or not at all; a full binding is asked again while it decodes.

NOTE (no deadlock under skew): the controller is the only one that launches steps, one
iteration at a time, and a step it launches on a group reaches every member in the same
order. A bound group runs only in iterations where none of its replicas runs, so no rank
ever waits in a collective for a peer that is busy in another one; a slow replica only
delays the iteration boundary.
"""

from __future__ import annotations

import logging

from nitsum.engine.engine import Engine
from nitsum.engine.request_spec import RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.parallel.topology import GroupShape
from nitsum.pool.bind_choice import Chooser
from nitsum.pool.bind_handback import hand_back
from nitsum.pool.bound import Binding, Pool

log = logging.getLogger(__name__)


class Binder:
    """The bindings of one PoolEngine: decide, bind, form, alternate, hand back, release."""

    def __init__(self, pe: Pool) -> None:
        self.pe = pe
        self.bindings: list[Binding] = []
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "tp_binds",
                "tp_binds_soft",
                "tp_bound_requests",
                "tp_binds_clamped",
                "bind_handbacks",
                "bind_soft_yields",
            ),
            0,
        )
        self.chooser = Chooser(pe.ecfg, pe.allowed, self.counters)

    # -- what runs ----------------------------------------------------------------------------
    def paused(self) -> set[GroupShape]:
        """Plan groups lent to a formed binding this iteration: not stepped."""
        return {g for b in self.bindings if b.formed and b.bound_turn for g in b.replicas}

    def engines(self) -> list[tuple[GroupShape, Engine]]:
        """Every binding's engine (formed or not: an unformed one may hold queued requests)."""
        return [(b.shape, b.engine) for b in self.bindings]

    def active(self) -> list[tuple[GroupShape, Engine]]:
        """The bound groups that run this iteration."""
        return [(b.shape, b.engine) for b in self.bindings if b.formed and b.bound_turn]

    def begin_iteration(self) -> None:
        """At an iteration boundary: form the bindings whose replicas drained, and give each
        soft one's replicas every other iteration while they have work."""
        self.form()
        for b in self.bindings:
            if not (b.formed and b.interleave):
                b.bound_turn = True
                continue
            waiting = any(self.pe.engines[g].has_unfinished() for g in b.replicas)
            b.bound_turn = not (b.bound_turn and waiting)
            self.counters["bind_soft_yields"] += not b.bound_turn

    # -- which level a request runs at ---------------------------------------------------------
    def levels(
        self, group: GroupShape, context: int, bind_tp: int | None, latency: bool
    ) -> tuple[int, int]:
        """(the TP level a request queued on plan group `group` runs at, the level its
        `context` tokens (prompt + `max_tokens`) need). The triggers: the context; its tier's
        `bind_tp` (a level the pool lacks: the largest one below it); with a TTFT target
        (`latency`) and `EngineConfig.bind_idle`, the largest idle level (`_idle_level`)."""
        allowed = self.pe.allowed
        if bind_tp is not None and bind_tp not in allowed:
            level = max((lv for lv in allowed if lv <= bind_tp), default=1)
            log.warning("bind_tp %d is not a TP level of this pool; binding %d", bind_tp, level)
            self.counters["tp_binds_clamped"] += 1
            bind_tp = level
        need = self._context_tp(context)
        tp = max(bind_tp or 1, need)
        if tp <= group.tp and self.pe.ecfg.bind_idle and latency:
            tp = self._idle_level(group)
        return tp, need

    def _idle_level(self, group: GroupShape) -> int:
        """The largest TP level whose aligned block around `group` holds only plan groups
        with no request at all and no binding (`group`'s own level if none).

        NOTE (the load trigger): under load some replica is always busy, so everything stays
        DP; a binding made here borrows idle devices for one request and gives them back."""
        busy = {d for b in self.bindings for d in b.shape.members}
        for tp in sorted(self.pe.allowed, reverse=True):
            if tp <= group.tp:
                break
            block = self.pe.topology.group_of(group.leader, tp)
            inside = [(g, e) for g, e in self.pe.engines.items() if g.overlaps(block)]
            if busy.isdisjoint(block.members) and all(
                g.within(block) and not e.request_ids() for g, e in inside
            ):
                return tp
        return group.tp

    def _context_tp(self, tokens: int) -> int:
        """The smallest TP level whose group's pages hold `tokens` tokens (the largest if
        none does)."""
        alloc = self.pe.alloc
        fits = [
            tp
            for tp in sorted(self.pe.allowed)
            if -(-tokens // alloc.tokens_per_page(tp)) <= alloc.num_pages
        ]
        return fits[0] if fits else max(self.pe.allowed)

    # -- binding --------------------------------------------------------------------------------
    def serve(
        self,
        tp: int,
        near: GroupShape,
        request_id: str,
        spec: RequestSpec,
        tokens: tuple[int, int],
        needed: bool,
    ) -> tuple[GroupShape, Engine]:
        """The engine a request of `tokens` (prompt, most output) that asks for TP `tp` near
        plan group `near` is queued on: the bound group's, or (the cost model said `dp`) a
        replica's. `needed`: no replica holds its context (never weighed).
        Hard: `spec.bind_hard`, default when it has a TTFT target."""
        hard = spec.bind_hard if spec.bind_hard is not None else spec.ttft_ms is not None
        mode, replica = "full", near
        bound = self.pe.topology.group_of(near.leader, tp)
        if not needed and self.chooser.active and bound.members[-1] < self.pe.pool.num_devices:
            block = {g: e for g, e in self.pe.engines.items() if g.overlaps(bound)}
            choice = self.chooser.admit(tp, block, *tokens, spec)
            if choice.mode == "dp":
                return choice.replica, self.pe.engines[choice.replica]
            mode, replica = choice.mode, choice.replica
        b = self._binding(tp, near, hard or mode == "prefill")
        b.requests.add(request_id)
        if mode == "prefill":
            b.prefill_only[request_id] = replica
        elif not needed and self.chooser.active:
            b.weighed.add(request_id)
        return b.shape, b.engine

    def _binding(self, tp: int, near: GroupShape, hard: bool) -> Binding:
        shape = self.pe.topology.group_of(near.leader, tp)
        members = list(shape.members)
        for b in self.bindings:
            if shape.within(b.shape):
                # NOTE: this binding (or a larger one) holds these devices: serve there; a
                # hard request stops a soft one's alternation (its replicas pause from now).
                b.interleave = b.interleave and not hard
                return b
            if b.shape.overlaps(shape):
                raise InvalidRequestError(
                    "bind_tp",
                    f"devices {tuple(members)} are bound as {b.shape.members} until it finishes",
                )
        if members[-1] >= self.pe.pool.num_devices:
            raise InvalidRequestError("bind_tp", f"the pool has no aligned group {tuple(members)}")
        replicas = [g for g in self.pe.engines if g.overlaps(shape)]
        if any(not g.within(shape) for g in replicas):
            raise InvalidRequestError("bind_tp", f"the plan's groups straddle {tuple(members)}")
        b = Binding(shape, replicas, self.pe.new_engine(shape), hard)
        # NOTE: a soft one's first iteration is its own (bound_turn flips at the boundary).
        b.interleave, b.bound_turn = not hard, hard
        self.bindings.append(b)
        self._form(b)  # NOTE: requests are added between steps: an iteration boundary
        return b

    def admitted(self, request_id: str) -> None:
        """`request_id`, bound, was accepted by its engine: count it (and its binding)."""
        for b in self.bindings:
            if request_id in b.requests:
                self.counters["tp_bound_requests"] += 1
                if not b.counted:
                    b.counted = True
                    self.counters["tp_binds"] += 1
                    self.counters["tp_binds_soft"] += not b.hard

    def _drain(self, b: Binding) -> None:
        """A binding short of pages: the replicas start nothing new from now on."""
        for g in b.replicas:
            self.pe.engines[g].admit_only(set())

    # -- forming and releasing (at iteration boundaries) ----------------------------------------
    def form(self) -> None:
        """Form every draining binding whose replicas now run nothing."""
        for b in self.bindings:
            if not b.formed and not any(self.pe.engines[g].running() for g in b.replicas):
                self._form(b)

    def _form(self, b: Binding) -> None:
        for g in b.replicas:
            replica = self.pe.engines[g]
            # NOTE: the replicas' idle cached pages go (to host, if any), or the bound group
            # could never get them; then their copies finish: they hold pages it might take.
            replica.reclaim(self.pe.alloc.num_pages)
            replica.settle_swaps()
            replica.admit_only(None)
        b.formed = True

    def step_done(self) -> None:
        """After a step: requests bound for their prompt, or no longer worth their binding,
        go back to a replica (bind_handback.py); a formed binding that ran but scheduled
        nothing is short of pages the replicas' sequences hold, so its replicas drain (finish
        what they run, start nothing new) and it forms again, pausing them, once they did;
        then `release`."""
        for b in self.bindings:
            if b.formed and b.bound_turn:
                hand_back(self.pe, b, self.chooser, self.counters)
            e = b.engine
            if b.formed and b.bound_turn and e.has_unfinished() and not e.running():
                b.formed, b.interleave = False, False
                self._drain(b)
        self.release()

    def release(self) -> None:
        """Give back the replicas of every binding whose requests all finished or left."""
        for b in list(self.bindings):
            if b.engine.has_unfinished() or (not b.formed and b.requests):
                continue
            for g in b.replicas:
                self.pe.engines[g].admit_only(None)
            self.pe.retired.update(b.engine.counters())
            b.engine.close()
            self.bindings.remove(b)

    def drop(self, request_id: str) -> None:
        """`request_id` left its binding (finished, aborted or handed back)."""
        for b in self.bindings:
            b.requests.discard(request_id)
            b.prefill_only.pop(request_id, None)
            b.weighed.discard(request_id)
