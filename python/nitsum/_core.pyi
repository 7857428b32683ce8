"""Types of `nitsum._core`, the Rust extension (scheduler-rs/src/python.rs): keep in step."""

def version() -> str:
    """Version of the native scheduler library."""

def health() -> str:
    """Liveness of the native library ("ok")."""

def plan(
    profile_json: str,
    tiers_json: str,
    demand_json: str,
    num_devices: int,
    previous_plan_json: str | None = None,
    config_json: str | None = None,
) -> str:
    """One planner decision as plan JSON (docs/planner.md); ValueError on invalid input."""

def simulate(config_json: str) -> str:
    """The cluster simulator's result JSON for a config JSON; ValueError on invalid input."""

def default_tiers() -> str:
    """The router's default tiers as JSON."""

def router_main(argv: list[str] | None = None) -> int:
    """Run the `nitsum-router` entry point (argv: program name first); its exit code."""

class BindingModel:
    """The cost model of per-request TP binding over one profile JSON (binding/); the
    simulator takes the same decisions. ValueError on an invalid profile."""

    def __init__(self, profile_json: str) -> None: ...
    def decide(self, query_json: str) -> str:
        """A `BindQuery` JSON's `BindDecision` JSON; ValueError on an invalid query."""
    def iteration_ms(self, tp: int, decoding: int, context: float, prefill_tokens: int) -> float:
        """The profile's time (ms) of one iteration of a group at TP `tp`; ValueError for a
        level the profile lacks."""
