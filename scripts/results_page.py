"""docs/results.md for results.py: per-sweep tables, the summary, and the page from its template."""

from __future__ import annotations

import math
from pathlib import Path
from string import Template

TEMPLATE = Path(__file__).with_name("results_template.md")
TARGET_ALL = 0.97  # issue 10: Nitsum >= 0.97x every baseline at every point of the sweep
TARGET_SHIFT = 1.2  # issue 10: >= 1.2x the best baseline at the shifting mixes' high loads


def _cell(run: dict, k: str | None = None) -> str:
    return f"{run['goodput_rps']:.1f} ({run['attainment']:.2f})" + (f" [{k}]" if k else "")


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def table(res: dict) -> str:
    """The per-point table of one sweep, with its heading and workload line."""
    lines = [
        f"#### {res['title']}",
        "",
        f"{res['requests']} requests; {res['workload_line']}; tiers TTFT/TPOT: "
        f"{res['tiers_line']}.",
        "",
        "| rate scale | offered req/s | Nitsum | greedy only | w/o dyn. TP [k] "
        "| static FCFS [k] | Split | Nitsum / best baseline "
        "| Nitsum / fixed-TP ablation (best k) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in res["points"]:
        r = p["runs"]
        fixed, static = p["best_fixed"], p["best_static"]
        lines.append(
            f"| {p['rate_scale']:g} | {p['offered_rps']:.1f} | {_cell(r['nitsum'])} | "
            f"{_cell(r['nitsum-greedy']) if 'nitsum-greedy' in r else '-'} | "
            f"{_cell(r[fixed], fixed.rsplit('tp', 1)[1])} | "
            f"{_cell(r[static], static.rsplit('tp', 1)[1])} | {_cell(r['split'])} | "
            f"{_ratio(p['nitsum_over_best'])} | {_ratio(p['nitsum_over_fixed'])} |"
        )
    return "\n".join(lines) + "\n"


def _span(xs: list[float]) -> str:
    return f"{min(xs):.2f} – {max(xs):.2f}" if xs else "–"


def summary(groups: dict[str, list[dict]]) -> str:
    """A table of Nitsum's ratios per sweep against issue 10's targets, and the totals."""
    lines = [
        "Nitsum / best baseline and / its best fixed-TP ablation over each sweep's points "
        f"(targets of issue 10: ≥ {TARGET_ALL} at every point; ≥ {TARGET_SHIFT} over the best "
        "baseline at the shifting mixes' two highest loads).",
        "",
        "| sweep | points | / best baseline (min – max) | points ≥ "
        f"{TARGET_ALL}× best baseline | / fixed-TP ablation (min – max) | points ≥ "
        f"{TARGET_ALL}× fixed-TP | / best baseline at the two highest loads |",
        "|---|---|---|---|---|---|---|",
    ]
    total = ok_best = ok_fixed = 0
    for group, results in groups.items():
        for res in results:
            best = [p["nitsum_over_best"] or 0.0 for p in res["points"]]
            fixed = [p["nitsum_over_fixed"] or 0.0 for p in res["points"]]
            n_best = sum(x >= TARGET_ALL for x in best)
            n_fixed = sum(x >= TARGET_ALL for x in fixed)
            total, ok_best, ok_fixed = total + len(best), ok_best + n_best, ok_fixed + n_fixed
            top = " / ".join(f"{x:.2f}" for x in best[-2:])
            lines.append(
                f"| {group}: {res['short']} | {len(best)} | {_span(best)} | {n_best} | "
                f"{_span(fixed)} | {n_fixed} | {top} |"
            )
    everything = [
        p["nitsum_over_best"] or 0.0 for rs in groups.values() for res in rs for p in res["points"]
    ]
    geo = math.exp(sum(math.log(max(x, 1e-9)) for x in everything) / max(len(everything), 1))
    lines += [
        "",
        f"Over all {total} points Nitsum reaches ≥ {TARGET_ALL}× the best baseline at {ok_best} "
        f"and ≥ {TARGET_ALL}× its own best fixed-TP ablation at {ok_fixed}; the geometric mean "
        f"of Nitsum / best baseline is {geo:.3f}.",
    ]
    return "\n".join(lines)


def choice_vs_greedy(groups: dict[str, list[dict]]) -> str:
    """What the strategy choice changes against the greedy alone, over every point."""
    pairs = [
        (f"{group.split(':')[0]} {res['short']} ×{p['rate_scale']}", runs)
        for group, results in groups.items()
        for res in results
        for p in res["points"]
        if "nitsum-greedy" in (runs := p["runs"])
    ]
    if not pairs:
        return "(no greedy-only runs in this sweep)"
    ratios = [
        (r["nitsum"]["goodput_rps"] / max(r["nitsum-greedy"]["goodput_rps"], 1e-9), label)
        for label, r in pairs
    ]
    total = sum(r["nitsum"]["goodput_rps"] for _, r in pairs)
    greedy = sum(r["nitsum-greedy"]["goodput_rps"] for _, r in pairs)
    better = [x for x in ratios if x[0] > 1.02]
    worse = [x for x in ratios if x[0] < 0.98]
    hi, lo = max(ratios), min(ratios)
    return (
        f"Over the {len(pairs)} points the choice changes total goodput by "
        f"{100 * (total / greedy - 1):+.1f}%: better than the greedy by > 2% at {len(better)} "
        f"points (up to {hi[0]:.2f}×, {hi[1]}), worse by > 2% at {len(worse)} (down to "
        f"{lo[0]:.2f}×, {lo[1]})."
    )


def tiers_table(rows: list[tuple[str, dict, dict]]) -> str:
    """Derived tiers per trace: (trace, tiers by name, unscaled bases)."""
    lines = [
        "  | trace | strict TTFT / TPOT (ms) | relaxed TTFT / TPOT (ms) | unscaled strict / "
        "relaxed (ms) |",
        "  |---|---|---|---|",
    ]
    for trace, t, b in rows:
        lines.append(
            f"  | {trace} | {t['strict']['ttft_ms']:.1f} / {t['strict']['tpot_ms']:.2f} | "
            f"{t['relaxed']['ttft_ms']:.1f} / {t['relaxed']['tpot_ms']:.2f} | "
            f"{b['strict_ttft_ms']:.1f} / {b['strict_tpot_ms']:.2f} and "
            f"{b['relaxed_ttft_ms']:.1f} / {b['relaxed_tpot_ms']:.2f} |"
        )
    return "\n".join(lines)


def workloads_table(results: list[dict]) -> str:
    """One row per shifting-mix workload (the 8-device sweep stands for both sizes)."""
    lines = [
        "  | workload | how it is built (`nitsum simulate` / `nitsum bench` flags) | requests | "
        "tier shares, whole run |",
        "  |---|---|---|---|",
    ]
    seen = set()
    for res in results:
        if res["workload"] in seen:
            continue
        seen.add(res["workload"])
        shares = ", ".join(f"{k} {v:.2f}" for k, v in res["tier_shares"].items())
        lines.append(
            f"  | {res['workload']} | {res['workload_flags']} | {res['requests']} | {shares} |"
        )
    return "\n".join(lines)


def render(fields: dict[str, str]) -> str:
    """The page: the template with `$name` fields filled (a missing field raises KeyError)."""
    return Template(TEMPLATE.read_text()).substitute(fields)
