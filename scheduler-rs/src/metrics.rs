//! Request metrics: lock-free per-tier histograms and counters, rendered as Prometheus text.
//! Plan and per-group gauges are rendered from a snapshot by `api::misc`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ids::TierId;
use crate::tiers::Tier;

/// Histogram bucket upper bounds in seconds (TTFT, TPOT and E2E share them).
pub const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A fixed-bucket histogram (cumulative on render).
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, secs: f64) {
        let i = BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((secs * 1e6).max(0.0) as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, tier: &str) {
        let mut cum = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{tier=\"{tier}\",le=\"{b}\"}} {cum}");
        }
        cum += self.counts[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{tier=\"{tier}\",le=\"+Inf\"}} {cum}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{tier=\"{tier}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{tier=\"{tier}\"}} {cum}");
    }
}

/// Counters and histograms of one tier.
#[derive(Debug, Default)]
pub struct TierMetrics {
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub e2e: Histogram,
    /// Requests accepted (dispatched to a worker), by class.
    pub feasible: AtomicU64,
    pub best_effort: AtomicU64,
    pub background: AtomicU64,
    /// Requests that finished with a completion.
    pub finished: AtomicU64,
    /// Finished requests that met both TTFT and TPOT: the goodput counter.
    pub slo_met: AtomicU64,
    /// Requests that ended with an error (worker failure, no capacity after retries).
    pub errors: AtomicU64,
    /// Requests cancelled by the client.
    pub cancelled: AtomicU64,
    /// Requests ended by the router's per-request deadline (`request_timeout_ms`).
    pub timed_out: AtomicU64,
    /// Requests refused with 503 because no worker could take them.
    pub rejected: AtomicU64,
    /// Re-dispatches after a worker died.
    pub retries: AtomicU64,
    /// Of those, re-dispatches of a request that had streamed tokens (resumed from them).
    pub resumed: AtomicU64,
    /// Completion tokens produced.
    pub tokens: AtomicU64,
}

/// Picks one counter of a tier.
type CounterOf = fn(&TierMetrics) -> &AtomicU64;

/// All request metrics, indexed like the config's tiers.
#[derive(Debug)]
pub struct Metrics {
    /// (tier name, metrics) in the config's tier order: a router `TierId` indexes it.
    pub tiers: Vec<(String, TierMetrics)>,
    /// Control rounds by result (`nitsum_plan_changes_total{result}`).
    pub plan_applied: AtomicU64,
    pub plan_refused: AtomicU64,
    pub plan_timeout: AtomicU64,
    /// Worker-plane refusals (docs/security.md).
    pub plane: crate::worker_auth::PlaneMetrics,
}

/// How one finished request went, for the histograms.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub ttft_s: Option<f64>,
    pub e2e_s: f64,
    pub tokens: u64,
}

impl Completion {
    /// Mean time per output token after the first (two tokens or more).
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        (self.tokens > 1).then(|| (self.e2e_s - ttft) / (self.tokens - 1) as f64)
    }

    /// Whether the completion met `tier`'s TTFT and TPOT (one with no token meets both).
    pub fn meets(&self, tier: &Tier) -> bool {
        let ttft_ok = self.ttft_s.is_none_or(|t| t * 1e3 <= tier.ttft_ms);
        ttft_ok && self.tpot_s().is_none_or(|t| t * 1e3 <= tier.tpot_ms)
    }
}

impl Metrics {
    pub fn new(tiers: &[Tier]) -> Self {
        Metrics {
            tiers: tiers
                .iter()
                .map(|t| (t.name.clone(), TierMetrics::default()))
                .collect(),
            plan_applied: AtomicU64::new(0),
            plan_refused: AtomicU64::new(0),
            plan_timeout: AtomicU64::new(0),
            plane: Default::default(),
        }
    }

    /// The metrics of tier `id`.
    pub fn tier(&self, id: TierId) -> &TierMetrics {
        &self.tiers[id.index()].1
    }

    /// Record a completed request and whether it met its tier's SLO.
    pub fn record_completion(&self, id: TierId, tier: &Tier, c: Completion) {
        let m = self.tier(id);
        m.finished.fetch_add(1, Ordering::Relaxed);
        m.tokens.fetch_add(c.tokens, Ordering::Relaxed);
        m.e2e.observe(c.e2e_s);
        if let Some(ttft) = c.ttft_s {
            m.ttft.observe(ttft);
            if let Some(tpot) = c.tpot_s() {
                m.tpot.observe(tpot);
            }
        }
        // NOTE: background tiers have no SLO; their completions always count as met.
        if c.meets(tier) || tier.background {
            m.slo_met.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Prometheus text of the per-tier metrics and the worker-plane refusals.
    pub fn render(&self, out: &mut String) {
        self.plane.render(out);
        let hist = [
            ("nitsum_ttft_seconds", "Time to first token.", 0),
            (
                "nitsum_tpot_seconds",
                "Mean time per output token after the first.",
                1,
            ),
            ("nitsum_e2e_seconds", "End-to-end request latency.", 2),
        ];
        for (name, help, which) in hist {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (tier, m) in &self.tiers {
                let h = [&m.ttft, &m.tpot, &m.e2e][which];
                h.render(out, name, tier);
            }
        }
        let counters: [(&str, &str, CounterOf); 10] = [
            (
                "nitsum_requests_finished_total",
                "Requests completed.",
                |m| &m.finished,
            ),
            (
                "nitsum_requests_slo_met_total",
                "Completed requests meeting TTFT and TPOT (goodput).",
                |m| &m.slo_met,
            ),
            (
                "nitsum_requests_error_total",
                "Requests ended with an error.",
                |m| &m.errors,
            ),
            (
                "nitsum_requests_cancelled_total",
                "Requests cancelled by the client.",
                |m| &m.cancelled,
            ),
            (
                "nitsum_requests_timed_out_total",
                "Requests ended by the per-request deadline (408).",
                |m| &m.timed_out,
            ),
            (
                "nitsum_requests_rejected_total",
                "Requests refused: no worker available.",
                |m| &m.rejected,
            ),
            (
                "nitsum_requests_retried_total",
                "Re-dispatches after a worker died.",
                |m| &m.retries,
            ),
            (
                "nitsum_requests_resumed_total",
                "Re-dispatches that resumed a request from the tokens it had streamed.",
                |m| &m.resumed,
            ),
            (
                "nitsum_generated_tokens_total",
                "Completion tokens generated.",
                |m| &m.tokens,
            ),
            (
                "nitsum_requests_background_total",
                "Background requests dispatched.",
                |m| &m.background,
            ),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (tier, m) in &self.tiers {
                let _ = writeln!(
                    out,
                    "{name}{{tier=\"{tier}\"}} {}",
                    get(m).load(Ordering::Relaxed)
                );
            }
        }
        let name = "nitsum_requests_dispatched_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests dispatched, by feasibility class.\n# TYPE {name} counter"
        );
        for (tier, m) in &self.tiers {
            for (class, c) in [
                ("feasible", &m.feasible),
                ("best_effort", &m.best_effort),
                ("background", &m.background),
            ] {
                let _ = writeln!(
                    out,
                    "{name}{{tier=\"{tier}\",class=\"{class}\"}} {}",
                    c.load(Ordering::Relaxed)
                );
            }
        }
        let name = "nitsum_plan_changes_total";
        let _ = writeln!(
            out,
            "# HELP {name} Control-loop plan changes, by result.\n# TYPE {name} counter"
        );
        for (result, c) in [
            ("applied", &self.plan_applied),
            ("refused", &self.plan_refused),
            ("timeout", &self.plan_timeout),
        ] {
            let _ = writeln!(
                out,
                "{name}{{result=\"{result}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let name = "nitsum_slo_attainment";
        let _ = writeln!(
            out,
            "# HELP {name} Fraction of completed requests that met their SLO.\n# TYPE {name} gauge"
        );
        for (tier, m) in &self.tiers {
            let f = m.finished.load(Ordering::Relaxed);
            let met = m.slo_met.load(Ordering::Relaxed);
            let frac = if f == 0 { 1.0 } else { met as f64 / f as f64 };
            let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {frac}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::default_tiers;

    #[test]
    fn slo_attainment_counts_ttft_and_tpot() {
        let tiers = default_tiers();
        let m = Metrics::new(&tiers);
        // strict: 250 ms TTFT, 25 ms TPOT.
        let ok = Completion {
            ttft_s: Some(0.1),
            e2e_s: 0.1 + 9.0 * 0.02,
            tokens: 10,
        };
        let slow_tpot = Completion {
            ttft_s: Some(0.1),
            e2e_s: 0.1 + 9.0 * 0.05,
            tokens: 10,
        };
        let slow_ttft = Completion {
            ttft_s: Some(0.3),
            e2e_s: 0.3,
            tokens: 1,
        };
        let strict = TierId(0);
        for c in [ok, slow_tpot, slow_ttft] {
            m.record_completion(strict, &tiers[0], c);
        }
        assert_eq!(m.tier(strict).finished.load(Ordering::Relaxed), 3);
        assert_eq!(m.tier(strict).slo_met.load(Ordering::Relaxed), 1);
        assert_eq!(m.tier(strict).ttft.count(), 3);
        assert_eq!(m.tier(strict).tpot.count(), 2);
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("nitsum_ttft_seconds_bucket{tier=\"strict\",le=\"0.1\"} 2"));
        assert!(out.contains("nitsum_ttft_seconds_count{tier=\"strict\"} 3"));
        assert!(out.contains("nitsum_requests_slo_met_total{tier=\"strict\"} 1"));
        assert!(out.contains("nitsum_slo_attainment{tier=\"strict\"} 0.3333"));
    }
}
