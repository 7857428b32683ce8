"""Plots for results.py: goodput vs load per policy, Nitsum's ratios, and a plan timeline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter  # noqa: E402

SERIES = (
    ("nitsum", "Nitsum", "tab:red", "o"),
    ("fixed", "Nitsum w/o dynamic TP (best fixed TP)", "tab:orange", "s"),
    ("static", "static TP-k FCFS, SGLang-like (best k)", "tab:blue", "^"),
    ("split", "per-tier Split (best TP per tier)", "tab:green", "v"),
)
DPI = 72


def series(res: dict, key: str) -> list[float]:
    """Goodput per point of one policy; `fixed`/`static` take the best k of each point."""
    out = []
    for p in res["points"]:
        name = {"fixed": p["best_fixed"], "static": p["best_static"]}.get(key, key)
        out.append(p["runs"][name]["goodput_rps"])
    return out


def _grid(n: int, ncols: int, w: float, h: float) -> tuple[Any, list[Any]]:
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def plot_goodput(results: list[dict], path: Path, ncols: int = 2) -> None:
    """One panel per sweep: goodput of every policy vs offered load (all tiers)."""
    fig, axes = _grid(len(results), ncols, 4.6, 3.5)
    for ax, res in zip(axes, results, strict=True):
        x = [p["offered_rps"] for p in res["points"]]
        ideal = [p["offered_slo_rps"] for p in res["points"]]
        ax.plot(x, ideal, "--", color="gray", lw=0.8, label="offered SLO-tier load (ideal)")
        for key, label, color, marker in SERIES:
            ax.plot(x, series(res, key), marker=marker, ms=4, color=color, label=label)
        ax.set_title(f"{res['title']}\n{res['tiers_line']}", fontsize=7)
        ax.set_xlabel("offered load, all tiers (req/s)", fontsize=8)
        ax.set_ylabel("goodput (req/s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_ratios(groups: dict[str, list[dict]], path: Path) -> None:
    """Per group of sweeps: Nitsum / best baseline (solid) and / its best fixed-TP ablation
    (dashed) vs offered load per device."""
    fig, axes = _grid(len(groups), len(groups), 4.6, 3.6)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, results) in zip(axes, groups.items(), strict=True):
        for i, res in enumerate(results):
            x = [p["offered_rps"] / res["devices"] for p in res["points"]]
            c = colors[i % len(colors)]
            best = [p["nitsum_over_best"] for p in res["points"]]
            fixed = [p["nitsum_over_fixed"] for p in res["points"]]
            ax.plot(x, best, "-o", ms=3, color=c, label=res["short"])
            ax.plot(x, fixed, "--s", ms=3, color=c, alpha=0.6)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(0.97, color="gray", lw=0.8, ls=":")
        if "shifting" in title:
            ax.axhline(1.2, color="tab:green", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{title}\nsolid: / best baseline; dashed: / fixed-TP ablation", fontsize=7)
        ax.set_xlabel("offered load per device (req/s)", fontsize=8)
        ax.set_ylabel("Nitsum goodput ratio", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# ---- plan timeline ----

GROUP = re.compile(r"^([PDM])(\d+)@(\d+):(.*)$")
ROLES = {"M": "mixed", "P": "prefill", "D": "decode"}
ROLE_CMAPS = {"mixed": "Blues", "prefill": "Oranges", "decode": "Greens"}
TIER_COLORS = {"strict": "tab:red", "relaxed": "tab:blue", "background": "tab:gray"}


def parse_timeline(timeline: list[Any]) -> list[tuple[float, list[tuple[str, int, str]]]]:
    """`[t_s, "M2@0:strict P1@2:relaxed+background D1@3:-"]` entries → (t, [(role, tp,
    tiers)]); also accepts `{"t_s"|"t", "layout"}` objects and plan objects with `groups`."""
    out = []
    for e in timeline:
        if isinstance(e, dict):
            t, layout = e.get("t_s", e.get("t")), e.get("layout", e.get("plan"))
        else:
            t, layout = e[0], e[1]
        groups = []
        if isinstance(layout, dict):
            for g in layout.get("groups", []):
                role = str(g.get("role", "mixed"))
                groups.append((role, int(g["tp"]), "+".join(g.get("tiers", [])) or "-"))
        else:
            for tok in str(layout).split():
                m = GROUP.match(tok)
                if m:
                    groups.append((ROLES[m[1]], int(m[2]), m[4]))
        out.append((float(t), groups))
    return out


def _steps(entries: list[tuple[float, dict[str, int]]], end: float, keys: list[str]) -> tuple:
    xs, ys = [], {k: [] for k in keys}
    for i, (t, counts) in enumerate(entries):
        t1 = entries[i + 1][0] if i + 1 < len(entries) else end
        for x in (t, t1):
            xs.append(x)
            for k in keys:
                ys[k].append(counts.get(k, 0))
    return xs, [ys[k] for k in keys]


def plot_timeline(
    timeline: list[Any], arrivals: list[tuple[float, str]], end_s: float, title: str, path: Path
) -> None:
    """Devices per (role, TP) and per tier served over time, above the arrivals' tier mix."""
    parsed = parse_timeline(timeline)
    by_kind, by_tier = [], []
    for t, groups in parsed:
        kinds: dict[str, int] = {}
        tiers: dict[str, int] = {}
        for role, tp, tier in groups:
            kinds[f"{role} TP{tp}"] = kinds.get(f"{role} TP{tp}", 0) + tp
            label = "shared" if "+" in tier else ("no SLO tier" if tier == "-" else tier)
            tiers[label] = tiers.get(label, 0) + tp
        by_kind.append((t, kinds))
        by_tier.append((t, tiers))
    levels = sorted({tp for _, gs in parsed for _, tp, _ in gs})
    kinds_all = [f"{r} TP{tp}" for r in ROLE_CMAPS for tp in levels]
    kinds_used = [k for k in kinds_all if any(k in c for _, c in by_kind)]
    tier_keys = sorted({k for _, c in by_tier for k in c}, key=lambda k: (k not in TIER_COLORS, k))
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(8, 6.6), sharex=True)
    xs, ys = _steps(by_kind, end_s, kinds_used)
    colors = []
    for k in kinds_used:
        role, tp = k.split(" TP")
        shade = 0.35 + 0.6 * (levels.index(int(tp)) + 1) / len(levels)
        colors.append(plt.get_cmap(ROLE_CMAPS[role])(shade))
    a1.stackplot(xs, ys, labels=kinds_used, colors=colors)
    a1.set_ylabel("devices", fontsize=8)
    a1.set_title(f"{title}: Nitsum's plan (devices per role and TP level)", fontsize=8)
    xs, ys = _steps(by_tier, end_s, tier_keys)
    extra = {"shared": "tab:purple", "no SLO tier": "lightgray"}
    tcolors = [TIER_COLORS.get(k, extra.get(k, "tab:olive")) for k in tier_keys]
    a2.stackplot(xs, ys, labels=tier_keys, colors=tcolors)
    a2.set_ylabel("devices", fontsize=8)
    a2.set_title("devices per tier served", fontsize=8)
    nb = 40
    width = end_s / nb
    counts: list[dict[str, int]] = [{} for _ in range(nb)]
    for t, tier in arrivals:
        b = counts[min(int(t / width), nb - 1)]
        b[tier] = b.get(tier, 0) + 1
    names = sorted({n for c in counts for n in c}, key=lambda k: (k not in TIER_COLORS, k))
    centers = [(i + 0.5) * width for i in range(nb)]
    rates = [[c.get(n, 0) / width for c in counts] for n in names]
    a3.stackplot(
        centers, rates, labels=names, colors=[TIER_COLORS.get(n, "tab:olive") for n in names]
    )
    a3.set_ylabel("arrivals (req/s)", fontsize=8)
    a3.set_xlabel("simulated time (s)", fontsize=8)
    a3.set_title("offered load per tier (the mix the plan follows)", fontsize=8)
    for ax in (a1, a2, a3):
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=0.3)
    a3.set_xlim(0, end_s)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
