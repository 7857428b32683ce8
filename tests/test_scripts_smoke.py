"""Every benchmark and measurement script under scripts/ runs, with tiny arguments, and prints
its rows: a refactor that breaks one fails here, not in the next session that needs its numbers.

Each script is either in SMOKE (its tiny command line and the rows it must print, each a
regular expression with the number of lines it must match) or in EXCLUDED with the reason; a
new script in neither fails `test_every_script_is_smoke_run_or_excluded`. The runs are bounded
(their arguments and a timeout), on CPU, loopback only.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
CPU_PROFILE = ROOT / "profiles" / "cpu-2core-SmolLM2-135M-Instruct.json"
NUM = r"[\d.]+"  # a number as the scripts print it


@dataclass(frozen=True)
class Smoke:
    """A script's smoke run: `args` after the script, split like a shell's, with `{tmp}` (a
    fresh directory), `{traces}`, `{cpu_profile}` and `{tiers}` (a file of TIERS) filled in;
    `rows`: the lines its output (stdout and stderr) must hold, as (regex, at least this many
    lines)."""

    args: str
    rows: tuple[tuple[str, int], ...]
    slow: bool = False
    timeout: float = 240.0
    needs_trace: bool = False
    files: tuple[tuple[str, str], ...] = ()  # (a file it writes under {tmp}, a regex in it)
    env: tuple[tuple[str, str], ...] = ()


TIERS = (
    '[{"name": "strict", "ttft_ms": 500, "tpot_ms": 50},'
    ' {"name": "relaxed", "ttft_ms": 5000, "tpot_ms": 200}]'
)
X = rf"{NUM}x"  # a ratio

SMOKE: dict[str, Smoke] = {
    # The host side, the client, simulations and the router: seconds each.
    "bench_fake.py": Smoke(
        "--ttft 0.01 --tpot 0.001 -- --trace bursty --bursty-duration 1"
        " --tiers strict:ttft=100,tpot=15 --out {tmp}/r.json",
        ((r"^requests (\d+) ok \1 errors 0 ", 1), (rf"^goodput {NUM} req/s, SLO attainment", 1)),
        files=(("r.json", '"strict"'),),
    ),
    "bench_host.py": Smoke(
        "--steps 3 --scenarios decode-1 decode-64",
        ((rf"^\[host\] +decode-(1|64): host +{NUM} ms/step, GPU step +{NUM} ms, host/GPU", 2),),
    ),
    "bench_forward.py": Smoke(
        "--device cpu --shape tiny --layers 1 --batch 1 --context 32 --chunk 16 --repeats 1",
        ((rf"^  \S.* +{NUM} ms +\({NUM} ms/layer\) +max\|Δlogits\| ", 7),),
        env=(("TRITON_INTERPRET", "1"),),
    ),
    "calibrate_planner.py": Smoke(
        "--trace {traces}/AzureLLMInferenceTrace_conv.csv --tiers {tiers} --devices 8"
        " --levels 1,2 --rate-scale 0.1",
        (
            (r"^\d+ requests over [\d.]+ s, 8 devices$", 1),
            (rf"  planned .* delivered .* total {NUM} req/s$", 2),
        ),  # fmt: skip
        needs_trace=True,
    ),
    # NOTE: after `cargo test --release` (scripts/test.sh) their examples are built; else
    # cargo builds them first (minutes), hence the timeout.
    "bench_planner.sh": Smoke(
        "--smoke", ((rf"target <= {NUM} ms at p99 (CPU|wall): (met|MISSED)", 4),), timeout=900
    ),
    "bench_router.sh": Smoke(
        "--requests 200 --replicas 4 --window 16 --latency-requests 50 --rate 200"
        " --http-connections 2",
        ((r"^summary: \{", 1),),
        files=(("bench_router.json", r'^\{".*\}$'),),
        env=(("BENCH_ROUTER_OUT", "{tmp}/bench_router.json"),),
        timeout=900,
    ),
    "results.py": Smoke(
        "--quick --out {tmp}",
        ((rf"^\S+ x{NUM}: {NUM} req/s", 2), (r"^wrote ", 1)),
        slow=True,
        needs_trace=True,
        files=(("results.md", "## Summary"), ("results.md", "## Measured on CPU")),
    ),
    # One engine in this process, on the embedded SmolLM2 or a tiny random model.
    "bench_engine.py": Smoke(
        "--smoke --batches 1 --repeats 1 --no-bf16",
        ((rf"^fp32 batch +1: e2e nitsum +{NUM} \| transformers +{NUM} tok/s \| ratio {X}", 1),),
        slow=True,
    ),
    "bench_overlap.py": Smoke(
        "--device cpu --shape tiny --batches 1 --dtype float32",
        ((rf"^\[decode\] batch +1: step +{NUM} ms synchronous, .*same tokens: True$", 1),),
        slow=True,
    ),
    "bench_gpu.py": Smoke(
        "--device cpu --shape tiny --points 1x32 --dtype float32",
        (
            (rf"^\[decode\] batch +1 x +32: +{NUM} tok/s", 1),
            (r"^\[decode\] recorded steps replayed: \d+", 1),
        ),  # fmt: skip
        slow=True,
    ),
    "gpu_agreement.py": Smoke(
        "--device cpu", ((r"^PASS ", 3), (r"^gpu_agreement: (\d+)/\1 cases pass$", 1)), slow=True
    ),
    "bench_long_prompt.py": Smoke(
        "--long 600 --shorts 1",
        ((rf"^(no TTFT target|TTFT 60 s): short first-token wait mean {NUM} s -> {NUM} s", 2),),
        slow=True,
    ),
    "bench_prefix.py": Smoke(
        "--history 64 --conversations 2 --small-kv-mb 16 --host-mb 32",
        (
            (
                rf"^(turn after turn|interleaved, .*): turn-2 TTFT median {NUM} ms -> {NUM} ms "
                rf"\({X} better\); prompt tokens computed (\d+) -> (\d+) ",
                3,
            ),
        ),
        slow=True,
        timeout=420.0,  # four engines on the embedded model: 71 s at load 4 on 2 cores
    ),
    "bench_preempt.py": Smoke(
        "--strict 3 --gap 0.1 --background 2 --bg-prompt 64 --bg-tokens 16 --batch 2 --kv-mb 16"
        " --conversations 2 --turns 2",
        ((rf"copy {NUM} MiB to host: memcpy {NUM} GB/s", 1), (rf"^swap vs .* P99 TTFT {X}", 2)),
        slow=True,
    ),
    # Device processes (a DevicePool each: seconds of start-up apiece), or servers.
    "bench_collectives.py": Smoke(
        "--reps 3",
        ((rf"^\[all-reduce, [24] processes\] .*: gloo +{NUM} us, shared +{NUM} us: {X}$", 6),),
        slow=True,
    ),
    "bench_shift.py": Smoke(
        "--smoke --hidden 64 --layers 1 --rounds 1",
        (
            (rf"^\[shift\] (decode b=|prefill n=).* {X} TP \(A/A noise", 4),
            (r"^\[shift\] worst point", 1),
            (rf"^\[e2e\]   shift vs TP: TTFT {X}, TPOT {X}, throughput {X}$", 2),
            (r"^\[shift\] device [01]: .* TP shards are views of it: True", 2),
        ),  # fmt: skip
        slow=True,
    ),
    "bench_pp.py": Smoke(
        "--hidden 64 --layers 4 --requests 2 --rounds 1",
        (
            (r"^\[switch\] .* MiB whose owner changed \(exact\)", 9),
            (rf"^\[decode\] batch +(1|32): TP4 \(4,1\) +{NUM} ms/token", 2),
            (rf"^\[switch\] restart of a layout: {NUM} ms; .*: {X} faster", 2),
        ),  # fmt: skip
        slow=True,
    ),
    "bench_tp_switch.py": Smoke(
        "--gib 0.005 --switches 3",
        (
            (r"^\[switch, no KV\] 3 switches .* created during the switches: 0$", 1),
            (rf"^\[migration\] +(pipelined|pipelined_socket|per_page): .* = {NUM} GB/s", 3),
            (r"^\[migration\] direct from .* copied KV bit-exact: True$", 1),
            (rf"^\[full switch\] TP1x4 -> TP2x2 with 8 running requests: {NUM} ms", 1),
        ),  # fmt: skip
        slow=True,
        timeout=400,
    ),
    "bench_binding.py": Smoke(
        "--binds 3 --seconds 1 --every 0.5 --hidden 64 --layers 2 --dp-batch 2",
        (
            (rf"^\[bind\] bind .* p50 {NUM} p99 {NUM} ms; release p50 {NUM}", 1),
            (r"^\[mixed\] (DP, priority -1|forced binding at TP 2|cost-aware binding) +: \d+ ", 5),
            (rf"^\[mixed\] .* vs DP: priority TTFT p50 {X} better", 3),
            (r"^\[context\] one replica holds \d+ tokens \(\d+-token prompt: refused\); ", 1),
        ),  # fmt: skip
        slow=True,
    ),
    "gpu_tp.py": Smoke("--device cpu --layers 2", ((r"^tp: all tokens agree$", 1),), slow=True),
    "bench_kv_transport.py": Smoke(
        "--tokens 64 --reps 1 --tls default",
        ((r"^handoff of 64 tokens", 1), (rf"^UCX_TLS=default +gloo {NUM} GB/s", 1)),
        slow=True,
    ),
    "validate_sim.py": Smoke(
        "--profile {cpu_profile} --trace-dir {traces} --duration 4 --max-requests 3 --warmup 0"
        " --workers 1 --out {tmp}",
        ((r"^\| real \| \d+/3 \| \d+ \| ", 1), (r"^\| sim \| \d+/3 \| \d+ \| ", 1)),
        slow=True,
        needs_trace=True,
        files=(("validate.json", '"real"'),),
    ),
    "real_shift_run.py": Smoke(
        "--devices 2 --static-levels --trace-dir {traces} --duration 3 --warmup 0 --out {tmp}",
        ((rf"^\| control \| .* \| {NUM} \| ", 1), (r"^total \d+ s; results in ", 1)),
        slow=True,
        needs_trace=True,
        files=(("real_shift.json", '"control"'),),
    ),
}

EXCLUDED: dict[str, str] = {
    # Not benchmarks: the project's own machinery, covered by CI itself or by tests of theirs.
    "setup.sh": "installs the environment: CI runs it before every test",
    "test.sh": "the test command itself",
    "lint.sh": "the lints: scripts/test.sh runs it on every CI run",
    "regen_wire_fixtures.py": "rewrites tests/golden/wire/, which tests/test_wire_golden.py checks",
    "regen_channel_vectors.py": "rewrites tests/golden/channel_v3.json (test_worker_channel.py)",
    "wide_tokenizer.py": "a tool, not a benchmark: tests/test_wide_tokenizer.py runs it",
    "random_model.py": "a tool writing gpu_check's served model (GBs at its smallest vocab)",
    "model_shapes.py": "a module of the GPU benchmarks: smoke-run through bench_gpu.py & co.",
    "results_page.py": "a module of results.py: smoke-run through it",
    "results_plots.py": "a module of results.py: smoke-run through it",
    "results_premium.py": "a module of results.py: smoke-run through it",
    "results_sim.py": "a module of results.py: smoke-run through it",
    "results_sweeps.py": "a module of results.py: smoke-run through it",
    "results_tiers.py": "a module of results.py: smoke-run through it",
    "gpu_table.py": "gpu_check.sh's table: tests/test_gpu_check.py judges its rows",
    "gpu_row.py": "gpu_check.sh's table: tests/test_gpu_check.py judges its rows",
    "gpu_perf_rows.py": "gpu_check.sh's table: tests/test_gpu_check.py judges its rows",
    "gpu_tp_rows.py": "gpu_check.sh's table: tests/test_gpu_check.py judges its rows",
    "gpu_runs.py": "gpu_check.sh's evidence: tests/test_gpu_runs.py packs and renders runs",
    "gpu_runs_doc.py": "gpu_check.sh's evidence: tests/test_gpu_runs.py renders docs/gpu.md",
    "step_log_summary.py": "tests/test_step_log.py summarizes a real step log with it",
    "bench_prefill.py": "tests/test_bench_prefill.py smoke-runs it (--device cpu --tiny)",
    # GPU only.
    "gpu_check.sh": "needs a lent GPU (its CPU dry run takes minutes; docs/gpu.md)",
    "gpu_serve.sh": "needs a lent GPU: gpu_check.sh's serving load on an 8B-vocab model",
    "profile_gpu.py": "needs a lent GPU: an 8B-shaped model with no tiny shape (standalone)",
    # Needs what this machine does not have.
    "client_agreement.py": "needs vLLM's `vllm bench serve` (not a dependency of the project)",
}


def scripts() -> set[str]:
    """Every script under scripts/: Python and shell files."""
    return {p.name for p in SCRIPTS.iterdir() if p.suffix in (".py", ".sh")}


def test_every_script_is_smoke_run_or_excluded():
    assert not set(SMOKE) & set(EXCLUDED)
    missing = sorted(scripts() - set(SMOKE) - set(EXCLUDED))
    assert missing == [], f"scripts with neither a smoke run nor a reason to skip: {missing}"
    gone = sorted((set(SMOKE) | set(EXCLUDED)) - scripts())
    assert gone == [], f"listed but not under scripts/: {gone}"
    assert all(reason.strip() for reason in EXCLUDED.values())


def fill(text: str, tmp: Path) -> str:
    """`text` with the placeholders of `Smoke` filled in."""
    for key, value in {
        "{tmp}": str(tmp),
        "{traces}": str(TRACE.parent),
        "{cpu_profile}": str(CPU_PROFILE),
        "{tiers}": str(tmp / "tiers.json"),
    }.items():
        text = text.replace(key, value)
    return text


def run_script(name: str, smoke: Smoke, tmp: Path) -> str:
    """Run one script with its smoke arguments; its output, stdout then stderr."""
    script = SCRIPTS / name
    (tmp / "tiers.json").write_text(TIERS)
    cmd = ["bash", str(script)] if name.endswith(".sh") else [sys.executable, str(script)]
    env = os.environ | {"PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    env |= {key: fill(value, tmp) for key, value in smoke.env}
    args = [fill(arg, tmp) for arg in shlex.split(smoke.args)]
    done = subprocess.run(
        cmd + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=smoke.timeout
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{out[-4000:]}"
    return out


def missing_rows(out: str, rows: tuple[tuple[str, int], ...]) -> list[str]:
    """The expectations `out` does not meet: a pattern matched by fewer lines than asked."""
    lines = out.splitlines()
    short = []
    for pattern, count in rows:
        got = sum(1 for line in lines if re.search(pattern, line))
        if got < count:
            short.append(f"{pattern!r}: {got} lines, want >= {count}")
    return short


def test_missing_rows_counts_matching_lines():
    out = "[a] x 1.5x\n[a] y 2.0x\n[b] z\n"
    assert missing_rows(out, ((rf"^\[a\] \w {NUM}x$", 2),)) == []
    [short] = missing_rows(out, ((rf"^\[a\] \w {NUM}x$", 3), (r"^\[b\]", 1)))
    assert short.endswith(": 2 lines, want >= 3")


def cases() -> list:
    return [
        pytest.param(name, marks=[pytest.mark.e2e] + ([pytest.mark.slow] if s.slow else []))
        for name, s in sorted(SMOKE.items())
    ]


@pytest.mark.parametrize("name", cases())
def test_smoke(name: str, tmp_path: Path):
    smoke = SMOKE[name]
    if smoke.needs_trace and not TRACE.exists():
        pytest.skip(f"shared trace not present: {TRACE}")
    out = run_script(name, smoke, tmp_path)
    assert missing_rows(out, smoke.rows) == [], out[-4000:]
    for file, pattern in smoke.files:
        assert re.search(pattern, (tmp_path / file).read_text()), (file, pattern)
