"""Types of `nitsum._core`, the Rust extension (scheduler-rs/src/python/): keep in step.

NOTE: every class is frozen (read-only attributes) and compares by value; the Rust types
(`tiers::Tier`, `stats::TierDemand`, `plan::Plan`, `binding::BindQuery`, ...) stay primary and
are converted field for field at the boundary. Only `simulate` takes and returns JSON.
"""

from typing import Literal

Role = Literal["prefill", "decode", "mixed"]
BindMode = Literal["dp", "prefill", "full"]

def version() -> str:
    """Version of the native scheduler library."""

def health() -> str:
    """Liveness of the native library ("ok")."""

class Tier:
    """One SLO tier (`tiers::Tier`; docs/tiers.md)."""

    name: str
    ttft_ms: float
    tpot_ms: float
    weight: float
    background: bool
    max_inflight: int | None
    max_tokens: int | None
    reject_unattainable: bool
    preempt: bool
    bind_tp: int | None
    def __init__(
        self,
        name: str,
        ttft_ms: float,
        tpot_ms: float,
        weight: float = 1.0,
        background: bool = False,
        max_inflight: int | None = None,
        max_tokens: int | None = None,
        reject_unattainable: bool = False,
        preempt: bool = True,
        bind_tp: int | None = None,
    ) -> None: ...

class LengthStats:
    """Length statistics in tokens (`stats::LengthStats`); the planner reads `mean`."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    def __init__(
        self, mean: float, count: int = 0, p50: float = 0.0, p90: float = 0.0, p99: float = 0.0
    ) -> None: ...

class TierDemand:
    """One tier's current demand (`stats::TierDemand`)."""

    tier: str
    rate_rps: float
    prompt: LengthStats
    output: LengthStats
    def __init__(
        self, tier: str, rate_rps: float, prompt: LengthStats, output: LengthStats
    ) -> None: ...

class Profile:
    """A validated performance profile from the file's text (docs/profile-schema.md);
    ValueError on an invalid one."""

    def __init__(self, text: str) -> None: ...
    @property
    def device(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def tp_levels(self) -> list[int]:
        """TP levels covered (pipeline depth 1), ascending."""

class GroupPlan:
    """One device group of a plan (`plan::GroupPlan`), its tiers by name."""

    members: list[int]
    tp: int
    pp: int
    role: Role
    tiers: list[str]
    accepts_background: bool
    max_rps: float
    max_inflight: float
    def __init__(
        self,
        members: list[int],
        tp: int,
        role: Role,
        tiers: list[str],
        accepts_background: bool = False,
        max_rps: float = 0.0,
        max_inflight: float = 0.0,
        pp: int = 1,
    ) -> None: ...

class Plan:
    """A plan (`plan::Plan`) and, per group, its decode batch cap (0: none)."""

    epoch: int
    groups: list[GroupPlan]
    batch_caps: list[float]
    def __init__(
        self, epoch: int, groups: list[GroupPlan], batch_caps: list[float] = ...
    ) -> None: ...

class PlannerConfig:
    """The planner's knobs (`planner::PlannerConfig`); what is not given keeps the router's
    default."""

    tp_levels: list[int] | None
    prefill_slack: float
    max_prefill_batch: int
    disaggregation: bool
    chunk_tokens: float
    slo_margin: float
    target_utilization: float
    keep_utilization: float
    switch_gain: float
    prior_lengths: tuple[float, float]
    def __init__(
        self,
        *,
        tp_levels: list[int] | None = None,
        prefill_slack: float | None = None,
        max_prefill_batch: int | None = None,
        disaggregation: bool | None = None,
        chunk_tokens: float | None = None,
        slo_margin: float | None = None,
        target_utilization: float | None = None,
        keep_utilization: float | None = None,
        switch_gain: float | None = None,
        prior_lengths: tuple[float, float] | None = None,
    ) -> None: ...

def plan(
    profile: Profile,
    tiers: list[Tier],
    demand: list[TierDemand],
    num_devices: int,
    previous: Plan | None = None,
    config: PlannerConfig | None = None,
) -> Plan:
    """One planner decision (docs/planner.md); ValueError on invalid input."""

def default_tiers() -> list[Tier]:
    """The router's default tiers (`config::default_tiers`)."""

def simulate(config_json: str) -> str:
    """The cluster simulator's result JSON for a config JSON; ValueError on invalid input."""

def router_main(argv: list[str] | None = None) -> int:
    """Run the `nitsum-router` entry point (argv: program name first); its exit code."""

class ReplicaLoad:
    """One plan group a binding would borrow (`binding::ReplicaLoad`); by default an idle
    DP replica."""

    tp: int
    decoding: int
    context: float
    prefill_tokens: int
    slowdown: float
    def __init__(
        self,
        tp: int = 1,
        decoding: int = 0,
        context: float = 0.0,
        prefill_tokens: int = 0,
        slowdown: float = 1.0,
    ) -> None: ...

class BindQuery:
    """A request a binding is considered for (`binding::BindQuery`)."""

    level: int
    prompt_tokens: int
    output_tokens: int
    replicas: list[ReplicaLoad]
    context_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    weight: float
    token_budget: int
    handoff_ms_per_token: float
    bound_slowdown: float
    replica_output_tokens: float
    replica_weight: float
    wait_ms: float
    def __init__(
        self,
        level: int,
        prompt_tokens: int,
        output_tokens: int,
        replicas: list[ReplicaLoad],
        context_tokens: int = 0,
        ttft_ms: float | None = None,
        tpot_ms: float | None = None,
        weight: float = 1.0,
        token_budget: int = 0,
        handoff_ms_per_token: float = 0.0,
        bound_slowdown: float = 1.0,
        replica_output_tokens: float = 128.0,
        replica_weight: float = 1.0,
        wait_ms: float = 0.0,
    ) -> None: ...

class BindOption:
    """One option's estimate (`binding::BindOption`)."""

    mode: BindMode
    ttft_ms: float
    tpot_ms: float
    meets: float
    lost_tokens: float
    value: float

class BindDecision:
    """The decision and what it weighed (`binding::BindDecision`); `replica` indexes the
    query's replicas, `gain` is the chosen value minus DP's."""

    mode: BindMode
    level: int
    replica: int
    gain: float
    options: list[BindOption]

class BindingModel:
    """The cost model of per-request TP binding over one profile (binding/); the simulator
    takes the same decisions."""

    def __init__(self, profile: Profile) -> None: ...
    def decide(self, query: BindQuery) -> BindDecision:
        """ValueError on an invalid query or a TP level the profile lacks."""
    def iteration_ms(self, tp: int, decoding: int, context: float, prefill_tokens: int) -> float:
        """The profile's time (ms) of one iteration of a group at TP `tp`; ValueError for a
        level the profile lacks."""
