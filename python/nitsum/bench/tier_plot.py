"""Per-tier picture of a `nitsum bench` results file: goodput, SLO attainment and the p90
TTFT / TPOT against each tier's targets, over the offered request rate.

One figure of four panels, written as SVG or PNG by the output's suffix. The data comes
from `tier_series`, a pure function, so it is tested without looking at pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nitsum.bench.pyplot import pyplot


@dataclass(frozen=True, slots=True)
class TierPoint:
    """One run of one SLO tier: offered load of the whole run and the tier's outcome."""

    rate: float
    goodput: float
    attainment: float | None
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None


@dataclass(frozen=True, slots=True)
class TierSeries:
    """A tier's points sorted by rate, and its targets."""

    name: str
    ttft_slo_ms: float
    tpot_slo_ms: float
    points: list[TierPoint]


def tier_series(results: dict[str, Any]) -> list[TierSeries]:
    """Per SLO tier (background tiers have no SLO and are left out), in the order the
    results list them, one point per run sorted by offered rate."""
    runs = sorted(results["runs"], key=lambda r: r["summary"]["request_rate"])
    names: list[str] = []
    for run in runs:
        names += [n for n in run["summary"]["tiers"] if n not in names]
    out = []
    for name in names:
        pts, slo = [], None
        for run in runs:
            t = run["summary"]["tiers"].get(name)
            if t is None or t["background"]:
                continue
            slo = (t["ttft_ms_slo"], t["tpot_ms_slo"])
            lat = t["latency"]
            pts.append(
                TierPoint(
                    run["summary"]["request_rate"],
                    t["goodput"],
                    t["attainment"],
                    lat["ttft_ms"]["p90"],
                    lat["tpot_ms"]["p90"],
                )
            )
        if pts and slo is not None:
            out.append(TierSeries(name, slo[0], slo[1], pts))
    return out


def plot_tiers(results: dict[str, Any], out: str | Path) -> None:
    """Write the four-panel per-tier figure of `results` to `out` (.svg or .png)."""
    series = tier_series(results)
    plt = pyplot()
    # NOTE: SVG text stays text (searchable, and a test can find the tier names in it).
    plt.rcParams["svg.fonttype"] = "none"
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    (ax_good, ax_att), (ax_ttft, ax_tpot) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(series):
        c = colors[i % len(colors)]
        x = [p.rate for p in s.points]
        ax_good.plot(x, [p.goodput for p in s.points], marker="o", color=c, label=s.name)
        att = [(p.rate, p.attainment) for p in s.points if p.attainment is not None]
        if att:
            ax_att.plot(*zip(*att, strict=True), marker="o", color=c, label=s.name)
        for ax, key, slo in (
            (ax_ttft, "ttft_p90_ms", s.ttft_slo_ms),
            (ax_tpot, "tpot_p90_ms", s.tpot_slo_ms),
        ):
            pts = [(p.rate, getattr(p, key)) for p in s.points if getattr(p, key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", color=c, label=f"{s.name} p90")
            ax.axhline(slo, color=c, linestyle="--", linewidth=0.8, label=f"{s.name} SLO")
    ax_good.set_ylabel("goodput (good requests/s)")
    ax_att.set_ylabel("SLO attainment")
    ax_att.set_ylim(0, 1.05)
    ax_ttft.set_ylabel("TTFT p90 (ms)")
    ax_tpot.set_ylabel("TPOT p90 (ms)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        ax.legend(fontsize=7)
    for ax in (ax_good, ax_ttft, ax_tpot):
        ax.set_ylim(bottom=0)
    for ax in axes[1]:
        ax.set_xlabel("offered load (requests/s)")
    fig.suptitle(f"nitsum bench per tier: {results.get('label') or ''}".rstrip(": "))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
