//! Step 1-2 of the planner (architecture §4): SLO-compliant throughput of one group per
//! (tier, TP level, role), from the profile and the tier's current mean lengths.
//!
//! Definitions (also in docs/planner.md), with `L_in` = mean prompt tokens, `S` = decode steps
//! per request = max(mean output − 1, 1) and `ctx` = `L_in` + mean output / 2 (the mean
//! context over a request's decode):
//! - prefill group, TP `t`: the largest number `n` of prompts whose one batched forward
//!   `prefill_ms(t, (n-1)·L_in + L_tail)` fits `prefill_slack × TTFT` (a request may wait for
//!   one batch in flight, then its own; `L_tail` = p90 prompt, so long prompts fit too);
//!   `P = 1000·n / prefill_ms(t, n·L_in)` requests/s per group.
//! - decode group: the largest batch `b ≤ max profiled batch` with `decode_ms(t, b, ctx) ≤
//!   TPOT`; `D = 1000·b / (decode_ms · S)` requests/s per group.
//! - mixed group (chunked prefill inside decode iterations): the largest `b` whose mean
//!   iteration `decode_ms(t, b, ctx) + prefill_extra_ms(t, b·L_in/S)` fits TPOT (each
//!   iteration also prefills, on average, the prompt share of the `b/S` requests finishing per
//!   iteration; `prefill_extra_ms` leaves out the forward's fixed part, paid by the decode),
//!   and whose TTFT estimate fits TTFT: a new prompt is prefilled in chunks of
//!   `C = max(chunk budget, b·L_in/S)` tokens, so it waits one such iteration and then takes
//!   `⌈L_tail / C⌉` of them. `M = 1000·b / (iter_ms · S)`. The mean prompt load per
//!   iteration `b·L_in/S` must also fit the chunk budget: the local scheduler (simulated and
//!   real) prefills at most that many prompt tokens per iteration, so a larger `b` plans a
//!   prompt rate the group can never prefill and its queue (TTFT) grows without bound.

use crate::profile::{Profile, Shape};
use crate::stats::TierDemand;
use crate::tiers::Tier;

/// Capacity of one group of a given shape for one tier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupEstimate {
    /// SLO-compliant requests/s of the group.
    pub rps: f64,
    /// Expected time a request stays assigned (arrival → last token), seconds; Little's law
    /// turns `rps` into the group's `max_inflight`.
    pub residence_s: f64,
    /// Decode batch cap the local scheduler should use (requests); 0 for prefill groups.
    pub batch_cap: f64,
}

/// Shape-independent inputs of a tier's estimates.
#[derive(Debug, Clone, Copy)]
pub struct TierShape {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    pub prompt: f64,
    /// p90 prompt tokens (at least the mean): TTFT checks use it so long prompts of a mixed
    /// distribution still meet TTFT, while throughput uses the mean.
    pub prompt_tail: f64,
    pub steps: f64,
    pub context: f64,
}

impl TierShape {
    pub fn new(tier: &Tier, demand: &TierDemand) -> Self {
        let prompt = demand.prompt.mean.max(1.0);
        let output = demand.output.mean.max(1.0);
        TierShape {
            ttft_ms: tier.ttft_ms,
            tpot_ms: tier.tpot_ms,
            prompt,
            prompt_tail: demand.prompt.p90.max(prompt),
            steps: (output - 1.0).max(1.0),
            context: prompt + output / 2.0,
        }
    }
}

/// Largest integer `x` in `[1, hi]` with `ok(x)`, assuming `ok` is monotone (true then false).
fn largest(hi: u32, ok: impl Fn(f64) -> bool) -> Option<u32> {
    if hi == 0 || !ok(1.0) {
        return None;
    }
    let (mut lo, mut hi) = (1u32, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if ok(f64::from(mid)) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

/// Prefill-only group of TP `tp`. `None` when one prompt alone misses TTFT.
pub fn prefill(
    p: &Profile,
    group: impl Into<Shape>,
    s: &TierShape,
    slack: f64,
    max_n: u32,
) -> Option<GroupEstimate> {
    let tp = group.into();
    // A batch of n prompts, one of them from the tail.
    let lat = |n: f64| p.prefill_ms(tp, (n - 1.0) * s.prompt + s.prompt_tail);
    let (n, utilization) = match largest(max_n, |n| lat(n) <= slack * s.ttft_ms) {
        Some(n) => (f64::from(n), 1.0),
        // No batching headroom, but a lone prompt still meets TTFT on an idle group: prompts
        // are served one by one, and the queue in front of a tail prompt may only take the
        // TTFT it leaves, `h`. With the M/D/1 mean wait ρ·s / (2(1 − ρ)) for a mean prefill
        // of `s` ms, that allows ρ ≤ 2h / (s + 2h); planning such a group at 100% (1/s) had
        // its TTFT queue grow without bound in simulation.
        None if lat(1.0) <= s.ttft_ms => {
            let (h, mean) = (s.ttft_ms - lat(1.0), p.prefill_ms(tp, s.prompt));
            (1.0, 2.0 * h / (mean + 2.0 * h))
        }
        None => return None,
    };
    let ms = p.prefill_ms(tp, n * s.prompt);
    let decode_guess = s.steps * s.tpot_ms;
    Some(GroupEstimate {
        rps: utilization * 1000.0 * n / ms,
        residence_s: (1.5 * ms + decode_guess) / 1000.0,
        batch_cap: 0.0,
    })
}

/// Decode-only group of TP `tp`. `None` when even batch 1 misses TPOT.
pub fn decode(p: &Profile, group: impl Into<Shape>, s: &TierShape) -> Option<GroupEstimate> {
    let tp = group.into();
    let step = |b: f64| p.decode_ms(tp, b, s.context);
    let b = f64::from(largest(p.max_batch(tp) as u32, |b| step(b) <= s.tpot_ms)?);
    let ms = step(b);
    Some(GroupEstimate {
        rps: 1000.0 * b / (ms * s.steps),
        residence_s: (s.ttft_ms + ms * s.steps) / 1000.0,
        batch_cap: b,
    })
}

/// Mixed (prefill + decode) group of TP `tp`. `None` when no batch meets both SLOs.
/// `chunk_tokens` is the local scheduler's prefill token budget per iteration.
pub fn mixed(
    p: &Profile,
    group: impl Into<Shape>,
    s: &TierShape,
    chunk_tokens: f64,
) -> Option<GroupEstimate> {
    let tp = group.into();
    let iter =
        |b: f64| p.decode_ms(tp, b, s.context) + p.prefill_extra_ms(tp, b * s.prompt / s.steps);
    let fits = |b: f64| iter(b) <= s.tpot_ms && b * s.prompt / s.steps <= chunk_tokens;
    let b = f64::from(largest(p.max_batch(tp) as u32, fits)?);
    let ms = iter(b);
    let chunk = chunk_tokens.max(b * s.prompt / s.steps);
    let burst = p.decode_ms(tp, b, s.context) + p.prefill_extra_ms(tp, chunk);
    let ttft = burst * (1.0 + (s.prompt_tail / chunk).ceil());
    if ttft > s.ttft_ms {
        return None;
    }
    Some(GroupEstimate {
        rps: 1000.0 * b / (ms * s.steps),
        residence_s: (ttft + ms * s.steps) / 1000.0,
        batch_cap: b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::LengthStats;

    /// Prefill 10 ms fixed + 0.1 ms/token; decode 10 ms + 1 ms per sequence (any context).
    pub(crate) fn linear_profile() -> Profile {
        Profile::from_json(
            r#"{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1],
            "prefill": {"1": [{"tokens": 1, "ms": 10.1}, {"tokens": 1001, "ms": 110.1}]},
            "decode": {"1": [{"batch": 1, "context": 10, "ms": 11}, {"batch": 64, "context": 10, "ms": 74}]}}"#,
        )
        .unwrap()
    }

    fn shape(ttft: f64, tpot: f64, prompt: f64, output: f64) -> TierShape {
        let tier = Tier {
            name: "t".into(),
            ttft_ms: ttft,
            tpot_ms: tpot,
            weight: 1.0,
            background: false,
            max_inflight: None,
            max_tokens: None,
            reject_unattainable: false,
            preempt: true,
            bind_tp: None,
        };
        let d = TierDemand {
            tier: "t".into(),
            rate_rps: 1.0,
            prompt: LengthStats::constant(prompt),
            output: LengthStats::constant(output),
        };
        TierShape::new(&tier, &d)
    }

    #[test]
    fn prefill_batches_prompts_within_half_ttft() {
        let p = linear_profile();
        // 100-token prompts: n prompts cost 10 + 10n ms; ≤ 0.5 × 190 ms → n = 8 (90 ms).
        let e = prefill(&p, 1, &shape(190.0, 50.0, 100.0, 11.0), 0.5, 64).unwrap();
        assert!((e.rps - 1000.0 * 8.0 / 90.0).abs() < 1e-9, "{e:?}");
        // TTFT 15 ms: one prompt (20.1 ms) misses it entirely.
        assert!(prefill(&p, 1, &shape(15.0, 50.0, 100.0, 11.0), 0.5, 64).is_none());
    }

    #[test]
    fn prefill_batch_leaves_room_for_a_tail_prompt() {
        let p = linear_profile();
        let mut s = shape(190.0, 50.0, 100.0, 11.0);
        s.prompt_tail = 300.0;
        // (n-1)·100 + 300 tokens: 10 + 0.1·(100n + 200) = 30 + 10n ≤ 95 → n = 6; the mean
        // batch of 600 tokens takes 70 ms.
        let e = prefill(&p, 1, &s, 0.5, 64).unwrap();
        assert!((e.rps - 1000.0 * 6.0 / 70.0).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn decode_takes_largest_batch_within_tpot() {
        let p = linear_profile();
        // step = 10 + b ms ≤ 40.5 → b = 30; 10 decode steps per request (11 output tokens).
        let e = decode(&p, 1, &shape(200.0, 40.5, 100.0, 11.0)).unwrap();
        assert_eq!(e.batch_cap, 30.0);
        assert!((e.rps - 1000.0 * 30.0 / (40.0 * 10.0)).abs() < 1e-9);
        // Capped at the largest profiled batch (64) even with a loose TPOT.
        assert_eq!(
            decode(&p, 1, &shape(200.0, 1e6, 100.0, 11.0))
                .unwrap()
                .batch_cap,
            64.0
        );
        assert!(decode(&p, 1, &shape(200.0, 10.0, 100.0, 11.0)).is_none());
    }

    #[test]
    fn mixed_pays_prefill_chunks_inside_tpot() {
        let p = linear_profile();
        // The prefill's fixed 10 ms is paid by the decode step: extra = 0.1 ms/token.
        // iter(b) = (10 + b) + 0.1·b·100/10 = 10 + 2b ≤ 61 → b = 25, iter = 60 ms.
        // A new prompt rides a 512-token chunk: (35 + 51.2) ms, twice (wait + own) = 172.4.
        let e = mixed(&p, 1, &shape(200.0, 61.0, 100.0, 11.0), 512.0).unwrap();
        assert_eq!(e.batch_cap, 25.0);
        assert!((e.rps - 1000.0 * 25.0 / 600.0).abs() < 1e-9);
        assert!((e.residence_s - (0.1724 + 0.6)).abs() < 1e-9, "{e:?}");
        assert!(mixed(&p, 1, &shape(170.0, 61.0, 100.0, 11.0), 512.0).is_none());
    }

    #[test]
    fn a_group_that_shifts_to_sp_plans_the_faster_mode_per_stage() {
        // TP 2: prefill 10 ms + 0.1 ms/token; as SP: 12 ms + 0.05 ms/token (faster past 40
        // tokens). Decode as SP is slower: the decode stage keeps TP's curve.
        let file = |sp: &str| {
            format!(
                r#"{{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [2],
                "prefill": {{"2": [{{"tokens": 1, "ms": 10.1}}, {{"tokens": 1001, "ms": 110.1}}]}},
                "decode": {{"2": [{{"batch": 1, "context": 10, "ms": 11}}, {{"batch": 64, "context": 10, "ms": 74}}]}}
                {sp}}}"#
            )
        };
        let tp_only = Profile::from_json(&file("")).unwrap();
        let shift = Profile::from_json(&file(
            r#", "sp_prefill": {"2": [{"tokens": 1, "ms": 12.05}, {"tokens": 1001, "ms": 62.05}]},
            "sp_decode": {"2": [{"batch": 1, "context": 10, "ms": 30}, {"batch": 64, "context": 10, "ms": 90}]}"#,
        ))
        .unwrap();
        let s = shape(190.0, 40.5, 100.0, 11.0);
        let (a, b) = (
            prefill(&tp_only, 2, &s, 0.5, 64).unwrap(),
            prefill(&shift, 2, &s, 0.5, 64).unwrap(),
        );
        // 8 prompts in 90 ms under TP; SP batches 16 (1600 tokens: 92 ms ≤ 95) in 92 ms.
        assert!(b.rps > 1.5 * a.rps, "{a:?} {b:?}");
        let (a, b) = (
            decode(&tp_only, 2, &s).unwrap(),
            decode(&shift, 2, &s).unwrap(),
        );
        assert_eq!((a.rps, a.batch_cap), (b.rps, b.batch_cap));
    }

    #[test]
    fn mixed_prompt_load_fits_the_chunk_budget() {
        let p = linear_profile();
        // TPOT alone allows b = 25 (250 prompt tokens per iteration); a 100-token budget
        // allows b·100/10 ≤ 100 → b = 10.
        let e = mixed(&p, 1, &shape(1e6, 61.0, 100.0, 11.0), 100.0).unwrap();
        assert_eq!(e.batch_cap, 10.0);
    }
}
