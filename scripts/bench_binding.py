"""Per-request TP binding (Flying Serving) on CPU device processes, side by side in one run.

A random GQA Llama (4 KV heads: TP 1/2; `--hidden` × `--layers`, big enough that a step is
compute, not messaging) on 2 device processes of one thread each, the plan two DP replicas
(0,) and (1,).

1. Bind + release latency without KV (a hard binding of an idle pool), p50/p99.
2. A small profile of this model on this pool (TP 1 and 2), measured with
   `nitsum.profiling.measure.measure_profile`: the cost model's input (issue 32).
3. A mixed workload: short DP requests keep both replicas busy; every `--every` s a priority
   request (a latency tier's, TTFT target 200 ms, `priority` -1) arrives. Its TTFT and TPOT,
   and the total throughput, in three rows with the same requests at the same times: served
   DP on the less-loaded replica; bound at TP 2 every time (`bind_policy="always"`: hard,
   the replicas pause); and as the cost model decides (`"cost"`: DP, bound for the prompt
   only, or bound with a handback). Then DP vs cost-aware with the priority rate doubled.
   Ratios against issue 32's targets, and the decisions of each mode taken.
4. The longest prompt served: one replica's KV vs a bound TP-2 group's (served to the end).

    python scripts/bench_binding.py [--binds 100] [--seconds 20] [--every 1.0] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec  # noqa: E402
from nitsum.engine.validation import validate_request  # noqa: E402
from nitsum.errors import InvalidRequestError  # noqa: E402
from nitsum.parallel.topology import GroupShape  # noqa: E402
from nitsum.pool.device_pool import DevicePool  # noqa: E402
from nitsum.pool.device_proc import ModelSource  # noqa: E402
from nitsum.pool.pool_engine import PoolEngine  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from tiny import random_llama, random_prompt  # noqa: E402

P = 4
ECFG = EngineConfig(page_tokens=P, token_budget=128, tp_levels=(1, 2), prefix_caching=False)


# The two TP-1 groups the benches start from.
DP2 = [GroupShape.tp_group((0,)), GroupShape.tp_group((1,))]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bind_latency(pool: DevicePool, cfg, pages: int, n: int) -> None:
    pe = PoolEngine(pool, cfg, ECFG, pages, DP2)
    binds, releases = [], []
    for i in range(n):
        t0 = time.perf_counter()
        pe.add_request(
            f"b{i}", random_prompt(cfg, 8, i), RequestSpec(greedy(1), bind_tp=2, ttft_ms=1e3)
        )
        binds.append(time.perf_counter() - t0)
        while pe.has_unfinished():
            pe.step()  # the release runs at the end of the step that finished it
        assert not pe.binder.bindings
    # The release alone: the step releases a binding whose request finished; put it back and
    # time the release call by itself.
    for i in range(n):
        pe.add_request(
            f"r{i}", random_prompt(cfg, 8, i), RequestSpec(greedy(1), bind_tp=2, ttft_ms=1e3)
        )
        b = pe.binder.bindings[0]
        pe.step()
        assert not b.engine.has_unfinished()
        pe.binder.bindings.append(b)  # undo the step's release to time it alone
        t0 = time.perf_counter()
        pe.binder.release()
        releases.append(time.perf_counter() - t0)
    ms = [x * 1e3 for x in binds]
    rs = [x * 1e3 for x in releases]
    print(
        f"[bind] bind (add_request of a bound request, hard, no KV) p50 {pct(ms, 0.5):.2f} "
        f"p99 {pct(ms, 0.99):.2f} ms; release p50 {pct(rs, 0.5):.3f} p99 {pct(rs, 0.99):.3f} ms "
        f"(target < 5 ms each)"
    )


def measured_profile(pool: DevicePool, cfg, pages: int, out: Path) -> str:
    """A small profile of the bench's model on the bench's pool (TP 1 and 2), for the cost
    model; returns its path."""
    from nitsum.profiling.measure import measure_profile

    pe = PoolEngine(pool, cfg, ECFG, pages, DP2)
    t0 = time.perf_counter()
    profile = measure_profile(
        pe, cfg, "bench-binding", "cpu", repeats=3, prefill_tokens=(16, 64, 128, 256),
        batches=(1, 4, 8, 16), contexts=(64, 256),
    )  # fmt: skip
    out.write_text(json.dumps(profile))
    print(
        f"[profile] measured TP 1/2 (prefill, decode, SP, PP) in {time.perf_counter() - t0:.0f} s"
    )
    return str(out)


def mixed(pool: DevicePool, cfg, pages: int, args, every: float, row: Row) -> dict:
    """The mixed workload under one row's policy: "dp" (the priority requests at priority -1
    on the less-loaded replica), "always" (bound at TP 2: hard, the replicas pause) or
    "cost" (the cost model decides per request: DP, bound for the prompt, or bound)."""
    policy = "always" if row.policy == "dp" else row.policy
    ecfg = replace(ECFG, bind_policy=policy, binding_profile=row.profile)
    pe = PoolEngine(pool, cfg, ecfg, pages, DP2)
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    tokens = 0
    t0 = time.monotonic()
    next_prio, n_short, n_prio = t0 + every / 2, 0, 0
    while time.monotonic() - t0 < args.seconds or pe.has_unfinished():
        now = time.monotonic()
        open_ = now - t0 < args.seconds
        for g in DP2:
            while open_ and len(pe.engines[g].request_ids()) < args.dp_batch:
                rid = f"d{n_short}"
                pe.add_request(
                    rid, random_prompt(cfg, 32, n_short), RequestSpec(greedy(16)), group=g
                )
                n_short += 1
        if open_ and now >= next_prio:
            rid = f"p{n_prio}"
            ids, params = random_prompt(cfg, 64, 10_000 + n_prio), greedy(32)
            # NOTE: the same request in every row; only the binding policy differs.
            bind_tp = None if row.policy == "dp" else 2
            spec = RequestSpec(params, ttft_ms=200, priority=-1, bind_tp=bind_tp)
            g = min(pe.engines, key=lambda g: len(pe.engines[g].request_ids()))
            pe.add_request(rid, ids, spec, group=g)
            arrival[rid] = now
            n_prio += 1
            next_prio += every
        for o in pe.step():
            now = time.monotonic()
            tokens += len(o.new_token_ids)
            if o.request_id in arrival and o.new_token_ids:
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
                count[o.request_id] = count.get(o.request_id, 0) + 1
    elapsed = time.monotonic() - t0
    ttft = [first[r] - arrival[r] for r in arrival]
    tpot = [(last[r] - first[r]) / (count[r] - 1) for r in arrival if count[r] > 1]
    c = pe.all_counters()
    return {
        "ttft50": statistics.median(ttft),
        "ttft99": pct(ttft, 0.99),
        "tpot50": statistics.median(tpot),
        "tok_s": tokens / elapsed,
        "prio": len(arrival),
        "binds": c["tp_binds"],
        **{m: c[f"bind_decisions_{m}"] for m in ("dp", "prefill", "full")},
        "handbacks": c["bind_handbacks"],
        "last": pe.last_bind,
    }


def rounds(pool: DevicePool, cfg, pages: int, args, every: float, rows: list) -> dict:
    """Each row's results over `args.rounds` rounds of all rows in turn (on a shared machine
    the load drifts; interleaving spreads it over the rows): per metric the median, the
    requests and decisions summed."""
    runs: dict[str, list[dict]] = {row.name: [] for row in rows}
    for _ in range(args.rounds):
        for row in rows:
            runs[row.name].append(mixed(pool, cfg, pages, args, every, row))
    summed = ("prio", "binds", "dp", "prefill", "full", "handbacks")
    out = {}
    for name, rs in runs.items():
        out[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "last"}
        out[name].update({k: sum(r[k] for r in rs) for k in summed}, last=rs[-1]["last"])
    return out


@dataclass(frozen=True)
class Row:
    name: str
    policy: str  # "dp", "always" or "cost"
    profile: str | None = None


def report(name: str, r: dict) -> None:
    decisions = f"decisions dp {r['dp']} / prefill {r['prefill']} / full {r['full']}"
    print(
        f"[mixed] {name:24s}: {r['prio']} priority requests, TTFT p50 "
        f"{r['ttft50'] * 1e3:.0f} p99 {r['ttft99'] * 1e3:.0f} ms, TPOT p50 "
        f"{r['tpot50'] * 1e3:.1f} ms; total {r['tok_s']:.0f} tokens/s; {r['binds']} binds "
        f"({decisions}, {r['handbacks']} handbacks)"
    )
    if r["last"] is not None:
        options = ", ".join(
            f"{o.mode}: TTFT {o.ttft_ms:.0f} ms, TPOT {o.tpot_ms:.0f} ms, P(meet) "
            f"{o.meets:.2f}, lost {o.lost_tokens:.0f} tokens, value {o.value:.2f}"
            for o in r["last"].options
        )
        print(f"[mixed]   its last decision {r['last'].mode!r} weighed {options}")


def compare(name: str, dp: dict, r: dict, doubled: bool) -> None:
    gain, loss = dp["ttft50"] / r["ttft50"], 1 - r["tok_s"] / dp["tok_s"]
    target = "no worse: >= 1x" if doubled else ">= 2x"
    met = loss <= 0.10 and gain >= (1.0 if doubled else 2.0)
    print(
        f"[mixed] {name} vs DP: priority TTFT p50 {gain:.2f}x better (target {target}), TPOT "
        f"{dp['tpot50'] / r['tpot50']:.2f}x; throughput loss {loss:.0%} (target <= 10%): "
        f"{'met' if met else 'MISSED'}"
    )


def longest(pool: DevicePool, cfg, pages: int) -> None:
    pe = PoolEngine(pool, cfg, ECFG, pages, DP2)
    dp_limit = pages * P  # tokens of one device at TP 1
    n = pe.max_servable_tokens() - 8
    ids = random_prompt(cfg, n, 1)
    try:
        # NOTE: the checks Engine.add_request runs, on one replica, without queueing anything.
        one = pe.engines[DP2[0]]
        validate_request(ids, greedy(4), one.cfg.vocab_size, one.max_context, one.scheduler.pages)
        dp = "accepted"
    except InvalidRequestError:
        dp = "refused"
    t0 = time.perf_counter()
    pe.add_request("long", ids, RequestSpec(greedy(4)))
    out = []
    while pe.has_unfinished():
        out += [t for o in pe.step() for t in o.new_token_ids]
    print(
        f"[context] one replica holds {dp_limit} tokens ({n}-token prompt: {dp}); a bound TP-2 "
        f"group {pe.max_servable_tokens()}: the {n}-token prompt served, {len(out)} tokens in "
        f"{time.perf_counter() - t0:.2f} s ({pe.max_servable_tokens() / dp_limit:.0f}x the "
        f"DP limit)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binds", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0, help="mixed workload: arrivals")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between priority ones")
    ap.add_argument("--dp-batch", type=int, default=8, help="short requests per replica")
    ap.add_argument(
        "--rounds", type=int, default=1, help="run the rows this often, interleaved: medians"
    )
    ap.add_argument("--profile", default=None, help="reuse this profile (default: measure one)")
    ap.add_argument("--profile-out", default=None, help="keep the measured profile here")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    hf, cfg = random_llama(args.hidden, args.layers, vocab=128, max_positions=8448)
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    pages = 512
    with (
        DevicePool(2, source, ECFG, pages, levels=(1, 2)) as pool,
        tempfile.TemporaryDirectory() as tmp,
    ):
        bind_latency(pool, cfg, pages, args.binds)
        profile = args.profile or measured_profile(
            pool, cfg, pages, Path(args.profile_out or Path(tmp) / "profile.json")
        )
        print(f"[mixed] {args.rounds} round(s) of every row, interleaved; medians over rounds")
        rows = [Row("DP, priority -1", "dp"), Row("forced binding at TP 2", "always"),
                Row("cost-aware binding", "cost", profile)]  # fmt: skip
        results = rounds(pool, cfg, pages, args, args.every, rows)
        for name, r in results.items():
            report(name, r)
        dp = results[rows[0].name]
        for row in rows[1:]:
            compare(row.name, dp, results[row.name], doubled=False)
        every = args.every / 2
        print(f"[mixed] priority arrivals doubled (every {every:g} s):")
        doubled = rounds(pool, cfg, pages, args, every, rows[::2])
        for name, r in doubled.items():
            report(name, r)
        compare(rows[2].name, doubled[rows[0].name], doubled[rows[2].name], doubled=True)
        longest(pool, cfg, pages)


if __name__ == "__main__":
    main()
