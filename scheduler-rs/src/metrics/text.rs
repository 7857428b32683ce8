//! Prometheus text of Nitsum's own request metrics (`nitsum_*`, labelled `tier`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Metrics, TierMetrics};

/// Picks one counter of a tier.
type CounterOf = fn(&TierMetrics) -> &AtomicU64;

impl Metrics {
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
                h.render(out, name, &format!("tier=\"{tier}\""));
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
            "# HELP {name} Fraction of completed requests that met their SLO (NaN: none completed).\n# TYPE {name} gauge"
        );
        for (tier, m) in &self.tiers {
            let frac = m.attainment().unwrap_or(f64::NAN);
            let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {frac}");
        }
    }
}
