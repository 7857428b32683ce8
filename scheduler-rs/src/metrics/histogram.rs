//! A lock-free fixed-bucket Prometheus histogram.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Observations land in the first bucket whose upper bound is at least the value; the last
/// count is the `+Inf` bucket. Buckets are cumulative only when rendered.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    /// Sum in millionths (microseconds for seconds, micro-tokens for token counts).
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((value * 1e6).max(0.0) as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// `_bucket`, `_sum` and `_count` lines of series `name{labels}` (`labels` is a
    /// comma-separated `key="value"` list, without braces).
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        cum += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cum}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum());
        let _ = writeln!(out, "{name}_count{{{labels}}} {cum}");
    }
}

/// `# HELP` and `# TYPE` lines of a metric family.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// `value` as a Prometheus label value: quotes, backslashes and newlines escaped.
pub fn label_value(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}
