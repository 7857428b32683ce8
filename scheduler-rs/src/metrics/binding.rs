//! The workers' per-request TP binding decisions as a Prometheus family (docs/metrics.md):
//! `nitsum_bind_decisions_total{worker, mode}`, one sample per mode (dp, prefill, full) of
//! every worker that reports them. The same counters are `nitsum_worker_stat` samples too;
//! this family carries the mode as a label so one query sums or rates them by mode.

use std::fmt::Write;

use crate::ids::WorkerId;
use crate::protocols::worker::Stats;

/// The family's name.
pub const BIND_DECISIONS: &str = "nitsum_bind_decisions_total";

/// Appends the family to `out`; nothing when no worker reports binding decisions.
pub fn render_bind_decisions(out: &mut String, stats: &[(WorkerId, Stats)]) {
    let rows: Vec<_> = stats
        .iter()
        .filter_map(|(w, s)| Some((w, s.bind_decisions()?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP {BIND_DECISIONS} Cost-model binding decisions the worker took, by chosen mode.\n\
         # TYPE {BIND_DECISIONS} counter"
    );
    for (w, by_mode) in rows {
        for (mode, n) in by_mode {
            let _ = writeln!(
                out,
                "{BIND_DECISIONS}{{worker=\"{w}\",mode=\"{mode}\"}} {n}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sample_per_mode_of_each_reporting_worker_and_nothing_without_them() {
        let reporting = Stats {
            bind_decisions_dp: Some(7),
            bind_decisions_full: Some(2),
            ..Stats::default()
        };
        let silent = Stats {
            tp_binds: Some(3),
            ..Stats::default()
        };
        let mut out = String::new();
        render_bind_decisions(&mut out, &[(WorkerId(4), silent.clone())]);
        assert_eq!(out, "");
        render_bind_decisions(&mut out, &[(WorkerId(4), reporting), (WorkerId(5), silent)]);
        let samples: Vec<_> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                "nitsum_bind_decisions_total{worker=\"4\",mode=\"dp\"} 7",
                "nitsum_bind_decisions_total{worker=\"4\",mode=\"prefill\"} 0",
                "nitsum_bind_decisions_total{worker=\"4\",mode=\"full\"} 2",
            ]
        );
        assert!(out.contains("# TYPE nitsum_bind_decisions_total counter"));
    }
}
