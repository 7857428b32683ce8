"""`nitsum profile`'s measurement on 4 CPU devices: every TP level, the SP stage with its fitted
threshold, and every pipeline shape; the router's planner reads the result."""

import json

import pytest

from nitsum import _core
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.device_proc import ModelSource
from nitsum.pool.pool_engine import PoolEngine
from nitsum.profiling.measure import measure_profile
from shapes import tp
from tiny import POOL_ECFG, POOL_PAGES, make_tiny

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def profile():
    hf, cfg = make_tiny("llama-deep")  # 4 layers, 4 KV heads: TP 1/2/4, PP 2/4
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(4, source, POOL_ECFG, POOL_PAGES, levels=(1, 2, 4)) as pool:
        pe = PoolEngine(pool, cfg, POOL_ECFG, POOL_PAGES, [tp(d) for d in range(4)])
        grid = {"prefill_tokens": (8, 32), "batches": (1, 4), "contexts": (16,)}
        return measure_profile(pe, cfg, "tiny", "cpu-test", repeats=1, **grid)


def test_every_mode_and_shape_is_measured(profile):
    assert profile["tp_levels"] == [1, 2, 4]
    assert sorted(profile["sp_prefill"]) == sorted(profile["sp_decode"]) == ["2", "4"]
    assert set(profile["shift_threshold"]) == {"2", "4"}
    assert all(t is None or t >= 0 for t in profile["shift_threshold"].values())
    assert profile["pipelines"] == ["1x2", "1x4", "2x2"]
    for table in ("prefill", "sp_prefill", "pp_prefill"):
        for points in profile[table].values():
            assert [p["tokens"] for p in points] == [8, 32]
            assert all(p["ms"] > 0 for p in points)
    for points in profile["pp_decode"].values():
        assert [(p["batch"], p["context"]) for p in points] == [(1, 16), (4, 16)]


def test_the_planner_reads_the_measured_profile(profile):
    """The router's planner takes the file (SP points, thresholds and pipeline tables
    included): well-formed groups over the devices, pipelines only of measured shapes."""
    lengths = (_core.LengthStats(32), _core.LengthStats(8))
    demand = [_core.TierDemand("strict", 1.0, *lengths)]
    tiers = [t for t in _core.default_tiers() if not t.background]
    plan = _core.plan(_core.Profile(json.dumps(profile)), tiers, demand, 4)
    devices = sorted(d for g in plan.groups for d in g.members)
    assert devices == [0, 1, 2, 3]
    for g in plan.groups:
        assert g.tp * g.pp == len(g.members)
        assert g.pp == 1 or f"{g.tp}x{g.pp}" in profile["pipelines"]
