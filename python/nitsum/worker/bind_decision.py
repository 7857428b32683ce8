"""A per-request TP binding decision on the wire: `last_bind` of the `stats` message.

The decision is taken by the cost model in scheduler-rs `binding/` (`nitsum._core.
BindingModel.decide`, which returns a typed `_core.BindDecision`); the pool keeps its latest
one (`PoolEngine.last_bind`) and the worker sends it as this dataclass (`from_core`). The
router decodes it into the same Rust type (`binding::BindDecision`) and shows it in
`/admin/plan` (docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from nitsum.codec import from_map, to_map

if TYPE_CHECKING:
    import nitsum._core as _core

BindMode = Literal["dp", "prefill", "full"]


@dataclass(frozen=True)
class BindOption:
    """One way to serve the request, as the cost model estimated it."""

    mode: BindMode
    ttft_ms: float
    tpot_ms: float
    meets: float  # probability that the request meets its targets (1 without targets)
    lost_tokens: float  # decode tokens the replicas' requests do not produce meanwhile
    value: float  # weight × meets − lost requests × replica weight


@dataclass(frozen=True)
class BindDecision:
    """The chosen mode and what was weighed (binding/ `BindDecision`).

    NOTE: `replica` indexes the query's replicas (the one DP would use, and that decodes
    after a prefill-only binding); `gain` is the chosen value minus DP's (≥ 0).
    """

    mode: BindMode
    level: int
    replica: int
    gain: float
    options: tuple[BindOption, ...]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BindDecision:
        """The decision from the wire map; ProtocolError naming the field when it has the
        wrong shape."""
        return from_map(cls, dict(raw), "last_bind")

    @classmethod
    def from_core(cls, d: _core.BindDecision) -> BindDecision:
        """The decision `BindingModel.decide` returned, field for field."""
        options = tuple(
            BindOption(o.mode, o.ttft_ms, o.tpot_ms, o.meets, o.lost_tokens, o.value)
            for o in d.options
        )
        return cls(d.mode, d.level, d.replica, d.gain, options)

    def to_wire(self) -> dict[str, Any]:
        """The map sent as `last_bind` (the keys of `from_dict`)."""
        return to_map(self)
