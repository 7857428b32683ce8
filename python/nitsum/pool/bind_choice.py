"""Whether a chosen binding pays: the worker's side of the cost model (issue 32).

A tier's `bind_tp` and the load trigger (`bind_idle`) *choose* a binding; the cost model
(scheduler-rs/src/binding/, through `nitsum._core.BindingModel`, the simulator's code too)
weighs it against DP from the profile and the block's real state at this iteration
boundary, and answers one of:

- `dp`: no binding: the request queues on the replica it names;
- `prefill`: bound for the prompt only, then its KV goes back to that replica to decode;
- `full`: bound for prompt and decode; asked again while it decodes (`prompt_tokens: 0`),
  it may be handed back to a replica when the rest is cheaper in DP.

A binding a context needs (no replica holds it) is never weighed. Without a profile, with
one that cannot load or that lacks a level the pool binds at, or with
`bind_policy="always"`, every trigger binds in full (one warning says why).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nitsum.engine.engine import Engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.parallel.topology import GroupShape

if TYPE_CHECKING:
    import nitsum._core as _core

log = logging.getLogger(__name__)

MODES = ("dp", "prefill", "full")
# Moving average of measured / profiled step time: the weight of a new step, and the range a
# single step may say (one stalled step must not flip every decision).
SLOWDOWN_WEIGHT = 0.1
SLOWDOWN_RANGE = (0.25, 8.0)


@dataclass(frozen=True)
class Choice:
    """A decision: its mode, the replica (a plan group) that DP or the decode after a
    prompt-only binding uses, and the decision as `BindingModel.decide` returned it."""

    mode: str
    replica: GroupShape
    decision: _core.BindDecision


def tier_targets(spec: RequestSpec) -> tuple[float | None, float | None, float]:
    """The request's tier targets the cost model weighs: TTFT and TPOT (ms; None: no
    target) and the tier's weight. NOTE: the one place that reads them from the spec."""
    return spec.ttft_ms, spec.tpot_ms, spec.weight


def load_model(ecfg: EngineConfig, levels: tuple[int, ...]) -> _core.BindingModel | None:
    """The cost model of `ecfg.binding_profile`, or None (with one warning when a profile was
    given but cannot serve: unreadable, invalid, or lacking one of `levels`)."""
    path = ecfg.binding_profile
    if ecfg.bind_policy != "cost" or path is None:
        return None
    from nitsum._core import BindingModel, Profile

    try:
        model = BindingModel(Profile(Path(path).read_text()))
        for level in levels:
            model.iteration_ms(level, 0, 0.0, 1)  # ValueError: a level the profile lacks
    except (OSError, ValueError) as e:
        log.warning(
            "binding profile %s cannot weigh bindings (%s): every binding trigger binds "
            "(bind_policy 'always')",
            path,
            e,
        )
        return None
    return model


class Chooser:
    """Asks the cost model about one block of plan groups and keeps what it answered:
    `last` (the most recent decision that acted: at arrival, or a handback) and the
    `bind_decisions_*` counters (decisions at arrival, by mode)."""

    def __init__(
        self, ecfg: EngineConfig, levels: tuple[int, ...], counters: dict[str, int]
    ) -> None:
        """`counters`: where the `bind_decisions_*` counters are kept (the binder's)."""
        self.ecfg = ecfg
        self.model = load_model(ecfg, tuple(lv for lv in levels if lv > 1) + (1,))
        self.last: _core.BindDecision | None = None
        self.counters = counters
        counters.update({f"bind_decisions_{m}": 0 for m in MODES})
        # Moving a prompt's KV back to a replica, ms per token (measured, moving average).
        self.handoff_ms_per_token = 0.0
        # Per TP level: steps' measured time over the profile's (moving average; 1 until a
        # step of that level ran). NOTE: the profile was measured elsewhere or alone; a
        # shared, busier or different machine runs every option slower, not alike.
        self.slowdown: dict[int, float] = {}

    @property
    def active(self) -> bool:
        return self.model is not None

    def admit(
        self,
        level: int,
        replicas: dict[GroupShape, Engine],
        prompt_tokens: int,
        output_tokens: int,
        spec: RequestSpec,
    ) -> Choice:
        """The decision for a new request of `prompt_tokens` (uncomputed) and at most
        `output_tokens` to generate, bound at `level` over the plan groups `replicas`."""
        query = self._query(level, replicas, spec, prompt_tokens, output_tokens, 0)
        choice = self._decide(query, list(replicas))
        self.counters[f"bind_decisions_{choice.mode}"] += 1
        self.last = choice.decision
        return choice

    def keep(self, level: int, replicas: dict[GroupShape, Engine], seq: Sequence) -> Choice:
        """Whether `seq`, prefilled and decoding bound at `level`, should stay bound (`full`)
        or go on on a replica (`dp`: kept in `last`; a `full` answer changes nothing)."""
        left = max(1, seq.sampling.max_tokens - len(seq.output_ids))
        query = self._query(level, replicas, seq.spec, 0, left, seq.num_computed)
        choice = self._decide(query, list(replicas))
        if choice.mode == "dp":
            self.last = choice.decision
        return choice

    def note_handoff(self, tokens: int, ms: float) -> None:
        """A prompt's KV of `tokens` moved back to a replica in `ms`."""
        if tokens > 0:
            self.handoff_ms_per_token = 0.8 * self.handoff_ms_per_token + 0.2 * ms / tokens

    def observe(self, tp: int, batch: list[Scheduled], ms: float) -> None:
        """A group at TP `tp` ran `batch` (before its tokens are applied) in `ms`, launch to
        collect: fold measured / profiled into `slowdown[tp]`."""
        if self.model is None or not self.ecfg.bind_calibrate or not batch or ms <= 0:
            return
        decode = [item.start for item in batch if item.start >= len(item.seq.prompt_ids)]
        prefill = sum(item.q_len for item in batch if item.start < len(item.seq.prompt_ids))
        context = sum(decode) / len(decode) if decode else 0.0
        try:
            profiled = self.model.iteration_ms(tp, len(decode), context, prefill)
        except ValueError:
            return  # a level the profile lacks: nothing to compare with
        if profiled <= 0:
            return
        lo, hi = SLOWDOWN_RANGE
        ratio = min(max(ms / profiled, lo), hi)
        old = self.slowdown.get(tp)
        self.slowdown[tp] = ratio if old is None else old + SLOWDOWN_WEIGHT * (ratio - old)

    def _decide(self, query: _core.BindQuery, groups: list[GroupShape]) -> Choice:
        assert self.model is not None
        decision = self.model.decide(query)
        return Choice(decision.mode, groups[decision.replica], decision)

    def _query(
        self,
        level: int,
        replicas: dict[GroupShape, Engine],
        spec: RequestSpec,
        prompt_tokens: int,
        output_tokens: int,
        context_tokens: int,
    ) -> _core.BindQuery:
        """A `BindQuery` (binding/) over the replicas' state now."""
        from nitsum._core import BindQuery, ReplicaLoad  # NOTE: late, as in `load_model`

        budget = self.ecfg.token_budget
        loads = []
        outputs: list[int] = []
        for group, engine in replicas.items():
            seqs = engine.sequences()
            decoding = [s.num_computed for s in engine.running() if s.prefilled]
            queued = sum(len(s.prompt_ids) - s.num_computed for s in seqs if not s.prefilled)
            loads.append(
                ReplicaLoad(
                    tp=group.tp,
                    decoding=len(decoding),
                    context=sum(decoding) / len(decoding) if decoding else 0.0,
                    prefill_tokens=min(queued, budget) if budget else queued,
                    slowdown=self.slowdown.get(group.tp, 1.0),
                )
            )
            outputs += [s.sampling.max_tokens for s in seqs]
        ttft_ms, tpot_ms, weight = tier_targets(spec)
        return BindQuery(
            level=level,
            prompt_tokens=prompt_tokens,
            output_tokens=max(1, output_tokens),
            replicas=loads,
            context_tokens=context_tokens,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            weight=weight,
            token_budget=budget,
            handoff_ms_per_token=self.handoff_ms_per_token,
            bound_slowdown=self.slowdown.get(level, 1.0),
            # NOTE: their requests' output is not known until they finish: their max_tokens.
            replica_output_tokens=sum(outputs) / len(outputs) if outputs else output_tokens,
            replica_weight=1.0,
        )
