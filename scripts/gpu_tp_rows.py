"""The rows of gpu_check.sh's `tp` section (scripts/gpu_tp.py): every multi-device mechanism
on device processes that share one GPU."""

from __future__ import annotations

from gpu_row import Row, SectionRun  # scripts/ is on the path

TP_SWITCH_MAX_MS = 1.0  # a TP switch with nothing to move
TP_KV_COPY_FRACTION_MIN = 0.5  # a KV move / a device-to-device copy of the same bytes


def tp_rows(run: SectionRun) -> list[Row]:
    """Correctness (judged on the dry run too, like agreement), then the switch and the KV
    move, timed on device processes that share one GPU (labelled so)."""
    d = run.data
    if d is None or "greedy" not in d:
        return [run.row("no summary", "all tokens equal TP 1's", False, "FAIL")]
    sw, g, kv, nokv = d["switch"], d["graphs"], d["kv_move"], d["switch_no_kv"]
    parts = ("bind", "sp", "pp")
    lost = sw["requests"] - sw["completed"]
    ok = all(d["greedy"].values()) and sw["same_tokens"] and lost == 0
    ok = ok and all(d[k]["same_tokens"] for k in parts)
    eq = {True: "=", False: "!="}
    numbers = "; ".join([
        f"{d['devices']} devices, {d['layers']} layers, {d['collectives']} collectives",
        "greedy " + ", ".join(f"{k.upper()} {eq[v]} TP1" for k, v in d["greedy"].items()),
        f"1->2->4->1 with {sw['requests']} requests: tokens {eq[sw['same_tokens']]} unswitched, "
        f"{lost} lost",
        "bind, SP, PP " + ", ".join(f"{eq[d[k]['same_tokens']]} TP1" for k in parts),
        f"graphs {g['graph_captures']} recorded, {g['graph_replays']} replays, "
        f"{g['graph_cuts']} cuts",
    ])  # fmt: skip
    verdict = "pass" if ok else "FAIL"
    target = "all tokens equal TP 1's, 0 lost"
    rows = [Row(run.section, run.result if ok else "FAIL", numbers, target, verdict, run.wall_s,
                run.budget_s)]  # fmt: skip
    with_kv = ", ".join(
        f"->{s['to']} {s['ms']:.1f} ms ({s['bytes'] / 2**20:.0f} MiB)" for s in sw["switches"]
    )
    numbers = f"no KV p50 {nokv['p50_ms']:.2f} ms (p99 {nokv['p99_ms']:.2f}); with KV {with_kv}"
    target = f"<= {TP_SWITCH_MAX_MS:g} ms without KV"
    rows.append(run.row(numbers, target, nokv["p50_ms"] <= TP_SWITCH_MAX_MS))
    numbers = (
        f"{kv['bytes'] / 2**20:.0f} MiB at {kv['gbps']:.1f} GB/s = {kv['of_copy']:.0%} of a "
        f"device copy ({kv['copy_gbps']:.1f} GB/s); "
        + ("read in place" if kv["direct"] else "NOT read in place")
    )
    target = f">= {TP_KV_COPY_FRACTION_MIN:.0%} of a device copy, read in place"
    met = kv["of_copy"] >= TP_KV_COPY_FRACTION_MIN and kv["direct"]
    rows.append(run.row(numbers, target, met, None if kv["direct"] else "FAIL"))
    label = " (shared GPU)" if d["gpu"] else ""
    for row, name in zip(rows[1:], ("switch", "KV move"), strict=True):
        row.section, row.wall_s, row.budget_s = f"{run.section} {name}{label}", 0.0, 0.0
    return rows
