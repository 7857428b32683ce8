"""`nitsum bench --plot-tiers`: per-tier data and an SVG that names the tiers; bench and
router default tiers come from one place."""

import json
import math

from nitsum import _core
from nitsum.bench.bench_cli import main
from nitsum.bench.tier_plot import TierPoint, tier_series
from nitsum.bench.tiers import DEFAULT_TIERS


def _tier(goodput, attainment, ttft_p90, tpot_p90, background=False):
    lat = {"ttft_ms": {"p90": ttft_p90}, "tpot_ms": {"p90": tpot_p90}}
    return {
        "background": background,
        "ttft_ms_slo": None if background else 250.0,
        "tpot_ms_slo": None if background else 25.0,
        "goodput": None if background else goodput,
        "attainment": None if background else attainment,
        "latency": lat,
    }


def _results():
    # Runs deliberately out of rate order: the series must come out sorted.
    return {
        "label": "demo",
        "runs": [
            {
                "summary": {
                    "request_rate": 4.0,
                    "tiers": {
                        "strict": _tier(1.5, 0.5, 400.0, 30.0),
                        "background": _tier(None, None, 900.0, 50.0, background=True),
                    },
                }
            },
            {
                "summary": {
                    "request_rate": 2.0,
                    "tiers": {
                        "strict": _tier(1.8, 0.9, 200.0, 20.0),
                        "relaxed": _tier(0.2, None, None, None),
                    },
                }
            },
        ],
    }


def test_tier_series_sorts_by_rate_and_leaves_background_out():
    series = tier_series(_results())
    assert [s.name for s in series] == ["strict", "relaxed"]
    strict = series[0]
    assert (strict.ttft_slo_ms, strict.tpot_slo_ms) == (250.0, 25.0)
    assert strict.points == [
        TierPoint(2.0, 1.8, 0.9, 200.0, 20.0),
        TierPoint(4.0, 1.5, 0.5, 400.0, 30.0),
    ]
    assert series[1].points == [TierPoint(2.0, 0.2, None, None, None)]


def test_plot_tiers_writes_an_svg_naming_each_tier(tmp_path):
    res = tmp_path / "r.json"
    res.write_text(json.dumps(_results()))
    out = tmp_path / "tiers.svg"
    assert main(["--compare", str(res), "--plot-tiers", str(out)]) == 0
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for text in ("strict p90", "relaxed", "SLO attainment", "TTFT p90 (ms)"):
        assert text in svg, text
    assert "background" not in svg


def test_bench_default_tiers_are_the_routers():
    router = _core.default_tiers()
    assert [t.name for t in DEFAULT_TIERS] == [t.name for t in router]
    for mine, theirs in zip(DEFAULT_TIERS, router, strict=True):
        assert mine.background == theirs.background
        if mine.background:
            assert math.isinf(mine.ttft_ms) and math.isinf(mine.tpot_ms)
        else:
            assert (mine.ttft_ms, mine.tpot_ms) == (theirs.ttft_ms, theirs.tpot_ms)
    # The values the docs state (docs/router.md, docs/metrics.md).
    assert [(t.name, t.ttft_ms, t.tpot_ms) for t in DEFAULT_TIERS[:2]] == [
        ("strict", 250.0, 25.0),
        ("relaxed", 2000.0, 100.0),
    ]
