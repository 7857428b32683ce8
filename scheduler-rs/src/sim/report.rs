//! Simulation results: per-request records, goodput and per-tier SLO attainment.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::stats::LengthStats;
use crate::tiers::Tier;

use super::bind_types::{BindCounts, BindRecord};
use super::reqs::Req;

/// One request's outcome. Latencies are `None` when it never got that far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Index in the config's `requests`.
    pub id: usize,
    pub tier: String,
    pub arrival_s: f64,
    pub input_len: u32,
    pub output_len: u32,
    /// Dispatch class: "feasible", "best_effort" or "background".
    pub class: String,
    pub ttft_ms: Option<f64>,
    /// Mean time per output token after the first (0 for one-token outputs).
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    /// Finished and met both SLOs of its tier (background tiers: finished).
    pub met: bool,
    /// Rejected or unroutable.
    pub dropped: bool,
}

/// Aggregates of one tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierResult {
    pub requests: u64,
    pub met: u64,
    pub dropped: u64,
    pub unfinished: u64,
    /// met / requests.
    pub attainment: f64,
    /// met / trace span.
    pub goodput_rps: f64,
    /// TTFT and TPOT distributions of finished requests, milliseconds.
    pub ttft_ms: LengthStats,
    pub tpot_ms: LengthStats,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    pub policy: String,
    pub devices: u32,
    /// Trace span (first to last arrival, at least 1 s): the goodput denominator.
    pub duration_s: f64,
    /// Requests of SLO (non-background) tiers.
    pub requests: u64,
    /// Of those, requests that met both SLOs.
    pub met: u64,
    /// `met / duration_s`: requests/s meeting both TTFT and TPOT of their tier.
    pub goodput_rps: f64,
    pub attainment: f64,
    /// Control windows that created or dissolved a group or changed a group's role (capacity
    /// and tier relabels alone do not count: they move nothing).
    pub reconfigurations: u64,
    /// Devices whose group changed, summed over reconfigurations.
    pub devices_moved: u64,
    pub per_tier: BTreeMap<String, TierResult>,
    pub records: Vec<RequestRecord>,
    /// Every layout the run switched to, tier relabels included (the initial one first): time
    /// (s) and the groups in `GroupPlan::summary` form, e.g.
    /// `[0.0, "M2@0:strict P1@2:relaxed D1@3:relaxed"]`.
    pub timeline: Vec<(f64, String)>,
    /// Policy `nitsum`: every selection round `[t_s, choice]`, with each candidate strategy's
    /// predicted goodput and why the winner won (`lookahead::Choice`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<(f64, super::choice::Choice)>,
    /// Binding decisions by chosen mode and hand-backs (`SimConfig::binding`).
    #[serde(default, skip_serializing_if = "BindCounts::is_zero")]
    pub bindings: BindCounts,
    /// The first decisions with their queries (with `records`), for parity checks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bind_log: Vec<BindRecord>,
}

/// The record of request `id` under `tiers`.
pub fn record(id: usize, r: &Req, tiers: &[Tier]) -> RequestRecord {
    let tier = &tiers[r.tier.index()];
    let (ttft, tpot) = latencies(r);
    let e2e = r.finish.map(|t| (t - r.arrival) * 1000.0);
    RequestRecord {
        id,
        tier: tier.name.clone(),
        arrival_s: r.arrival,
        input_len: r.input,
        output_len: r.output,
        class: r.class.as_str().to_string(),
        ttft_ms: ttft,
        tpot_ms: tpot,
        e2e_ms: e2e,
        met: met(r, tier),
        dropped: r.dropped,
    }
}

/// (TTFT, TPOT) in ms, where it got that far (TPOT 0 for one-token outputs).
fn latencies(r: &Req) -> (Option<f64>, Option<f64>) {
    let ttft = r.first_token.map(|t| (t - r.arrival) * 1000.0);
    let tpot = match (r.first_token, r.finish) {
        (Some(f), Some(e)) if r.output > 1 => Some((e - f) * 1000.0 / f64::from(r.output - 1)),
        (Some(_), Some(_)) => Some(0.0),
        _ => None,
    };
    (ttft, tpot)
}

/// Whether `r` finished within both SLOs of `tier` (background tiers: finished).
pub fn met(r: &Req, tier: &Tier) -> bool {
    match latencies(r) {
        (Some(a), Some(b)) => tier.background || (a <= tier.ttft_ms && b <= tier.tpot_ms),
        _ => false,
    }
}

/// Aggregate records into a result.
pub fn summarize(
    policy: String,
    devices: u32,
    span: f64,
    tiers: &[Tier],
    records: Vec<RequestRecord>,
    (reconfigurations, devices_moved): (u64, u64),
    keep_records: bool,
) -> SimResult {
    let mut per_tier = BTreeMap::new();
    let (mut requests, mut met) = (0, 0);
    for t in tiers {
        let mine: Vec<&RequestRecord> = records.iter().filter(|r| r.tier == t.name).collect();
        let n = mine.len() as u64;
        let ok = mine.iter().filter(|r| r.met).count() as u64;
        let mut ttft: Vec<f64> = mine
            .iter()
            .filter_map(|r| r.e2e_ms.and(r.ttft_ms))
            .collect();
        let mut tpot: Vec<f64> = mine.iter().filter_map(|r| r.tpot_ms).collect();
        if !t.background {
            requests += n;
            met += ok;
        }
        per_tier.insert(
            t.name.clone(),
            TierResult {
                requests: n,
                met: ok,
                dropped: mine.iter().filter(|r| r.dropped).count() as u64,
                unfinished: mine
                    .iter()
                    .filter(|r| !r.dropped && r.e2e_ms.is_none())
                    .count() as u64,
                attainment: if n == 0 { 0.0 } else { ok as f64 / n as f64 },
                goodput_rps: ok as f64 / span,
                ttft_ms: LengthStats::of(&mut ttft),
                tpot_ms: LengthStats::of(&mut tpot),
            },
        );
    }
    SimResult {
        policy,
        devices,
        duration_s: span,
        requests,
        met,
        goodput_rps: met as f64 / span,
        attainment: if requests == 0 {
            0.0
        } else {
            met as f64 / requests as f64
        },
        reconfigurations,
        devices_moved,
        per_tier,
        timeline: Vec::new(),
        choices: Vec::new(),
        bindings: BindCounts::default(),
        bind_log: Vec::new(),
        records: if keep_records { records } else { Vec::new() },
    }
}
