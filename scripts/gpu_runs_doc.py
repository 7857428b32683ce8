"""docs/gpu.md's runs section, generated from the run directories under docs/gpu/runs/
(gpu_runs.py unpacks them): per run, newest first, its header, gpu_check's table (from
rows.jsonl) and the rows a reader can set beside vLLM's and SGLang's: decode per
batch x prompt (decode.json) and the closed-loop serving load per concurrency (serve.json).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpu_table import Row, table  # scripts/ is on the path

BEGIN = (
    "<!-- BEGIN gpu-runs: generated from docs/gpu/runs/ by `python scripts/gpu_runs.py render`;"
    " do not edit by hand -->"
)
END = "<!-- END gpu-runs -->"
DRY_RUN = (
    "**CPU dry run, not a GPU result**: every section run on a CPU with tiny shapes to show "
    "the script, its files and this page work end to end; its timings mean nothing and no "
    "target is judged."
)


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def decode_table(d: dict) -> list[str]:
    """decode.json's points: tok/s, the step against its floor (weights + KV at the copy rate)
    and the bandwidth reached as % of the copy rate and of the spec sheet."""
    spec = "-" if d.get("spec_gbps") is None else f"{d['spec_gbps']:.0f} GB/s"
    out = [
        f"Decode, {d['new_tokens']} new tokens after each prompt (`decode.json`; copy rate "
        f"{d['copy_gbps']:.0f} GB/s, spec {spec}, weights {d['weight_bytes'] / 1e9:.2f} GB):",
        "",
        "| batch | prompt | tok/s | step ms | floor ms (weights + KV) | x floor | % of copy rate "
        "| % of spec |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in d["points"]:
        out.append(
            f"| {p['batch']} | {p['prompt']} | {p['tok_s']:.0f} | {p['step_ms']:.2f} | "
            f"{p['floor_ms']:.2f} | {p['floor_ratio']:.2f} | {p['pct_copy']:.0f} | "
            f"{_num(p['pct_spec'], '.0f')} |"
        )
    return out


def serve_table(d: dict) -> list[str]:
    """serve.json's closed-loop runs, as `vllm bench serve` reports them (total: prompt and
    output tokens over the wall time, its "Total Token throughput")."""
    runs = [r for r in d.get("runs") or [] if "max_concurrency" in r]
    if not runs:
        return []
    out = [
        "Serving, closed loop (`serve.json`; `nitsum bench --trace random`, as `vllm bench "
        "serve --dataset-name random`):",
        "",
        "| concurrency | ok / requests | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms "
        "| output tok/s | total tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s = r["summary"]
        lat = s["latency"]
        out.append(
            f"| {r['max_concurrency']} | {s['n_ok']} / {s['n_requests']} | "
            f"{_num(lat['ttft_ms']['p50'])} / {_num(lat['ttft_ms']['p99'])} | "
            f"{_num(lat['itl_ms']['p50'], '.2f')} / {_num(lat['itl_ms']['p99'], '.2f')} | "
            f"{_num(lat['tpot_ms']['p50'], '.2f')} | {s['output_tokens_per_s']:.0f} | "
            f"{s['output_tokens_per_s'] + s['input_tokens_per_s']:.0f} |"
        )
    return out


def run_section(run: Path) -> str:
    """One run's part of the page."""
    meta = json.loads((run / "meta.json").read_text())
    where = "CPU dry run" if meta["dry_run"] else f"one {meta['gpu']}"
    files = ", ".join(f"`{f}`" for f in sorted(meta["files"]))
    lines = [
        f"### {meta['date']} {meta['time']}, {where}",
        "",
        f"[`docs/gpu/runs/{run.name}/`](gpu/runs/{run.name}/): {files}.",
        "",
    ]
    if meta["dry_run"]:
        lines += [DRY_RUN, ""]
    if meta.get("left_out"):
        lines += [f"Left out of the archive (over 16 MiB): {', '.join(meta['left_out'])}.", ""]
    rows_file = run / "rows.jsonl"
    rows = [Row(**json.loads(ln)) for ln in rows_file.read_text().splitlines() if ln.strip()]
    lines += [meta["head"], "", table(rows, meta["device"]), ""]
    for name, render in (("decode.json", decode_table), ("serve.json", serve_table)):
        path = run / name
        data = json.loads(path.read_text()) if path.is_file() else None
        body = render(data) if data else []
        if body:
            lines += [*body, ""]
    return "\n".join(lines)


def render(runs: Path) -> str:
    """Every run's part, newest first."""
    dirs = sorted((d for d in runs.glob("*/meta.json")), reverse=True) if runs.is_dir() else []
    return "\n".join(run_section(d.parent) for d in dirs) or "(no run directories yet)\n"


def with_runs(doc: str, runs: Path) -> str:
    """`doc` (docs/gpu.md) with the text between its BEGIN and END markers rendered anew."""
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:start] + "\n\n" + render(runs).rstrip("\n") + "\n\n" + doc[end:]
