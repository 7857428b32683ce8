//! Whether binding a request into a TP group pays (Flying Serving §4.2, made cost-aware).
//!
//! A binding borrows the DP replicas of one aligned block of devices: while the bound group
//! runs they pause, so every request they serve waits. This module weighs, from the profile,
//! what a bound request gains against what the replicas' work loses, for three options:
//!
//! - **DP**: the request runs on the replica where it starts soonest, first in its queue;
//! - **prefill**: the block is bound for the prompt only (one forward at TP k), then the KV
//!   goes back to that replica, which decodes it (TP decode of one request rarely pays);
//! - **full**: bound for prompt and decode (the replicas pause until it finishes).
//!
//! Each option's value, in goodput units (requests meeting their SLOs, weighted by tier):
//! `weight × P(meet)` for the request, minus the replicas' requests it costs, counted as the
//! decode tokens they do not produce while delayed divided by their mean output length. The
//! costs are *marginal*: the DP option also delays the chosen replica's batch (its iteration
//! carries the prompt), so a binding pays only its extra device time, not the prompt's work.
//! `P(meet)` is smooth (a logistic in the estimate's relative error, `SPREAD`): a request far
//! inside its target gains little from a faster path, one near or past it gains much.
//!
//! Pure and synchronous: the worker's binder calls it through `nitsum._core` and the
//! simulator calls it natively, so both take the same decisions (docs/binding.md).
//!
//! The query and decision types are `query.rs`.

mod query;
#[cfg(test)]
mod tests;

use anyhow::{ensure, Result};

use crate::profile::Profile;

pub use query::{BindDecision, BindMode, BindOption, BindQuery, ReplicaLoad};

/// Relative error of a latency estimate: `P(meet)` is ½ at the target, 0.98 at half of it.
pub const SPREAD: f64 = 0.25;

/// How much more an option must be worth than DP to bind (requests): keeps ties in DP,
/// where nothing pauses.
pub const MIN_GAIN: f64 = 0.01;

/// P(latency `est` ≤ `target`) when the estimate is off by about `SPREAD` of itself.
fn attain(est: f64, target: Option<f64>) -> f64 {
    match target {
        None => 1.0,
        Some(t) if est <= 0.0 => f64::from(u8::from(t > 0.0)),
        Some(t) => 1.0 / (1.0 + ((est - t) / (SPREAD * est)).exp()),
    }
}

/// The cost model over one profile.
#[derive(Debug, Clone)]
pub struct BindingModel {
    profile: Profile,
}

impl BindingModel {
    pub fn new(profile: Profile) -> Self {
        Self { profile }
    }

    pub fn from_json(profile_json: &str) -> Result<Self> {
        Ok(Self::new(Profile::from_json(profile_json)?))
    }

    /// A prompt of `tokens` alone on TP `tp`, in chunks of `budget`.
    fn prefill_alone(&self, tp: u32, tokens: u32, budget: u32) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let b = if budget == 0 { tokens } else { budget };
        let full = tokens / b;
        let rest = tokens % b;
        let mut ms = f64::from(full) * self.profile.prefill_ms(tp, f64::from(b));
        if rest > 0 {
            ms += self.profile.prefill_ms(tp, f64::from(rest));
        }
        ms
    }

    /// Error unless the profile has TP level `tp`.
    pub fn check_level(&self, tp: u32) -> Result<()> {
        ensure!(
            self.profile.has_tp(tp),
            "binding: the profile has no TP level {tp}"
        );
        Ok(())
    }

    /// The profile's time (ms) of one iteration of replica `r` with `extra` more prompt
    /// tokens (its `slowdown` not applied: what the worker compares its measurements with).
    pub fn iteration_ms(&self, r: &ReplicaLoad, extra: u32) -> f64 {
        let tokens = f64::from(r.prefill_tokens + extra);
        if r.decoding == 0 {
            if tokens == 0.0 {
                return 0.0;
            }
            return self.profile.prefill_ms(r.tp, tokens);
        }
        let ctx = r.context.max(1.0);
        self.profile.decode_ms(r.tp, f64::from(r.decoding), ctx)
            + self.profile.prefill_extra_ms(r.tp, tokens)
    }

    /// One iteration of replica `r` with `extra` more prompt tokens, as it runs here.
    fn iteration(&self, r: &ReplicaLoad, extra: u32) -> f64 {
        self.iteration_ms(r, extra) * r.slowdown.max(0.0)
    }

    /// Tokens replica `r`'s batch would produce in `ms` (its iteration rate).
    fn tokens_in(&self, r: &ReplicaLoad, ms: f64) -> f64 {
        let it = self.iteration(r, 0);
        if r.decoding == 0 || it <= 0.0 {
            return 0.0;
        }
        f64::from(r.decoding) * ms / it
    }

    /// The decision for `q`. Errors on a query the profile cannot answer.
    pub fn decide(&self, q: &BindQuery) -> Result<BindDecision> {
        ensure!(!q.replicas.is_empty(), "binding: no replicas");
        ensure!(
            q.output_tokens >= 1,
            "binding: output_tokens must be at least 1"
        );
        self.check_level(q.level)?;
        for r in &q.replicas {
            self.check_level(r.tp)?;
        }
        let p = q.prompt_tokens;
        let out = f64::from(q.output_tokens);
        let prefilled = p == 0;
        let per_request = q.replica_output_tokens.max(1.0);

        // DP: the replica where the request's first token comes soonest. Its prompt rides in
        // that replica's iterations (chunked), delaying its batch by the prompt's extra time.
        let chunks = if q.token_budget == 0 || p == 0 {
            u32::from(p > 0)
        } else {
            p.div_ceil(q.token_budget)
        };
        let dp_ttft = |r: &ReplicaLoad| -> f64 {
            if p == 0 {
                return 0.0;
            }
            let per = if chunks <= 1 { p } else { q.token_budget };
            f64::from(chunks) * self.iteration(r, per)
        };
        let ttfts: Vec<f64> = q.replicas.iter().map(dp_ttft).collect();
        let replica = (0..ttfts.len())
            .min_by(|&a, &b| ttfts[a].total_cmp(&ttfts[b]))
            .expect("non-empty");
        let (dp_r, dp_first) = (&q.replicas[replica], ttfts[replica]);
        let ctx_end = f64::from(q.context_tokens + p) + out / 2.0;
        let dp_tpot = dp_r.slowdown.max(0.0)
            * self.profile.decode_ms(
                dp_r.tp,
                f64::from(dp_r.decoding + 1),
                ((dp_r.context * f64::from(dp_r.decoding) + ctx_end)
                    / f64::from(dp_r.decoding + 1))
                .max(1.0),
            );
        // Its batch's extra time: the prompt's part of its iterations, then one more sequence
        // in each decode step.
        let prompt_delay = (dp_first - f64::from(chunks) * self.iteration(dp_r, 0)).max(0.0);
        let decode_delay = if dp_r.decoding == 0 {
            0.0
        } else {
            let base = dp_r.slowdown.max(0.0)
                * self
                    .profile
                    .decode_ms(dp_r.tp, f64::from(dp_r.decoding), dp_r.context.max(1.0));
            (dp_tpot - base).max(0.0) * (out - 1.0).max(0.0)
        };
        let dp_lost = self.tokens_in(dp_r, prompt_delay + decode_delay);

        // Bound: every replica pauses while the bound group runs, from when the block is free.
        let bound = q.bound_slowdown.max(0.0);
        let bound_prefill = bound * self.prefill_alone(q.level, p, q.token_budget);
        let wait = q.wait_ms.max(0.0);
        let paused = |ms: f64| -> f64 { q.replicas.iter().map(|r| self.tokens_in(r, ms)).sum() };
        let handoff = if prefilled {
            0.0
        } else {
            q.handoff_ms_per_token * f64::from(p)
        };
        let full_tpot = bound * self.profile.decode_ms(q.level, 1.0, ctx_end.max(1.0));
        let pre_lost = paused(bound_prefill) + self.tokens_in(dp_r, decode_delay);
        let full_lost = paused(bound_prefill + full_tpot * (out - 1.0).max(0.0));

        let option = |mode, ttft_ms: f64, tpot_ms: f64, lost: f64| {
            let meets = if prefilled {
                attain(tpot_ms, q.tpot_ms)
            } else {
                attain(ttft_ms, q.ttft_ms) * attain(tpot_ms, q.tpot_ms)
            };
            let value = q.weight * meets - lost / per_request * q.replica_weight;
            BindOption {
                mode,
                ttft_ms,
                tpot_ms,
                meets,
                lost_tokens: lost,
                value,
            }
        };
        let mut options = vec![option(BindMode::Dp, dp_first, dp_tpot, dp_lost)];
        if q.level > dp_r.tp && q.output_tokens > 1 && !prefilled {
            options.push(option(
                BindMode::Prefill,
                wait + bound_prefill + handoff,
                dp_tpot,
                pre_lost,
            ));
        }
        if q.level > dp_r.tp {
            options.push(option(
                BindMode::Full,
                wait + bound_prefill,
                full_tpot,
                full_lost,
            ));
        }
        let dp_value = options[0].value;
        // NOTE: on a tie the last option wins (full over prefill over DP is never a tie with
        // DP: MIN_GAIN): an idle block binds in full, where it costs nothing.
        let best = options
            .iter()
            .filter(|o| o.mode == BindMode::Dp || o.value > dp_value + MIN_GAIN)
            .max_by(|a, b| a.value.total_cmp(&b.value))
            .expect("DP is always an option");
        Ok(BindDecision {
            mode: best.mode,
            level: q.level,
            replica,
            gain: best.value - dp_value,
            options,
        })
    }

    /// `decide` over JSON (the `nitsum._core` entry point).
    pub fn decide_json(&self, query_json: &str) -> Result<String> {
        let q: BindQuery = serde_json::from_str(query_json)
            .map_err(|e| anyhow::anyhow!("binding: invalid query: {e}"))?;
        Ok(serde_json::to_string(&self.decide(&q)?)?)
    }
}
