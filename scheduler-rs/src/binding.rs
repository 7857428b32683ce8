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

use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};

use crate::profile::Profile;

/// Relative error of a latency estimate: `P(meet)` is ½ at the target, 0.98 at half of it.
pub const SPREAD: f64 = 0.25;

/// How much more an option must be worth than DP to bind (requests): keeps ties in DP,
/// where nothing pauses.
pub const MIN_GAIN: f64 = 0.01;

/// One plan group inside the block a binding would borrow, as of this iteration boundary.
/// NOTE: its default is an idle DP replica (TP 1), in Rust as in JSON.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplicaLoad {
    /// Its TP level (1 for a DP replica).
    #[serde(default = "one")]
    pub tp: u32,
    /// Sequences in its decode batch.
    #[serde(default)]
    pub decoding: u32,
    /// Their mean context (tokens).
    #[serde(default)]
    pub context: f64,
    /// Prompt tokens its next iteration runs besides the request's.
    #[serde(default)]
    pub prefill_tokens: u32,
    /// Its iterations' measured time over the profile's (1: as profiled): a machine that is
    /// shared, hotter or otherwise not the profiled one (the worker keeps a moving average).
    #[serde(default = "unit")]
    pub slowdown: f64,
}

impl Default for ReplicaLoad {
    fn default() -> Self {
        Self {
            tp: 1,
            decoding: 0,
            context: 0.0,
            prefill_tokens: 0,
            slowdown: 1.0,
        }
    }
}

fn one() -> u32 {
    1
}

/// A request a binding is considered for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BindQuery {
    /// The bound group's TP level.
    pub level: u32,
    /// Prompt tokens still to compute (0: already prefilled: only decode is weighed, and
    /// "prefill"/"dp" both mean running the rest on a replica).
    pub prompt_tokens: u32,
    /// Output tokens still to generate (at least 1).
    pub output_tokens: u32,
    /// Tokens already in its KV (a prefilled request's prompt and output so far).
    #[serde(default)]
    pub context_tokens: u32,
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    /// Its tier's weight.
    #[serde(default = "unit")]
    pub weight: f64,
    /// The plan groups inside the block (at least one).
    pub replicas: Vec<ReplicaLoad>,
    /// Prompt tokens per iteration (chunked prefill); 0: unchunked.
    #[serde(default)]
    pub token_budget: u32,
    /// Moving the prompt's KV from the bound group back to a replica, per token (ms).
    #[serde(default)]
    pub handoff_ms_per_token: f64,
    /// The bound group's measured forward time over the profile's (as `ReplicaLoad`'s).
    #[serde(default = "unit")]
    pub bound_slowdown: f64,
    /// The replicas' requests: mean output tokens (their loss in requests is tokens over
    /// this) and mean tier weight.
    #[serde(default = "default_output")]
    pub replica_output_tokens: f64,
    #[serde(default = "unit")]
    pub replica_weight: f64,
    /// Until every group of the block is free to bind (ms): the rest of their current
    /// iterations and any binding already holding them. A bound option starts after it (the
    /// replicas keep working meanwhile, so it costs them nothing); 0: at once.
    #[serde(default)]
    pub wait_ms: f64,
}

fn unit() -> f64 {
    1.0
}

fn default_output() -> f64 {
    128.0
}

/// The three ways to serve the request.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BindMode {
    Dp,
    Prefill,
    Full,
}

/// One option's estimate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BindOption {
    pub mode: BindMode,
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    /// Probability that the request meets its targets (1 without targets).
    pub meets: f64,
    /// Decode tokens the replicas' requests do not produce meanwhile (vs an idle request).
    pub lost_tokens: f64,
    /// `weight × meets − lost requests × replica weight`.
    pub value: f64,
}

/// The decision and what it weighed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BindDecision {
    pub mode: BindMode,
    /// The bound group's TP level weighed (the query's).
    pub level: u32,
    /// The replica (index into `replicas`) for DP and for the decode after a prefill binding.
    pub replica: usize,
    /// Chosen value minus DP's (≥ 0).
    pub gain: f64,
    pub options: Vec<BindOption>,
}

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

#[cfg(test)]
#[path = "binding_tests.rs"]
mod tests;
