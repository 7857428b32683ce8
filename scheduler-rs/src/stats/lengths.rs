//! Length distributions: a sample's mean and nearest-rank quantiles, and their Kaplan-Meier
//! counterparts when some lengths are still growing (right-censored).

use serde::{Deserialize, Serialize};

/// Mean and a few quantiles of a length distribution (tokens). In JSON every field may be
/// omitted (0); the planner reads `mean`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LengthStats {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl LengthStats {
    /// Statistics of `values` (nearest-rank quantiles). All zero when empty.
    pub fn of(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let q = |p: f64| values[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        LengthStats {
            count: n as u64,
            mean: values.iter().sum::<f64>() / n as f64,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
        }
    }

    /// A point distribution (every request has length `len`); handy for tests and traces.
    pub fn constant(len: f64) -> Self {
        LengthStats {
            count: 1,
            mean: len,
            p50: len,
            p90: len,
            p99: len,
        }
    }
}

/// Kaplan-Meier mean of lengths of which `done` are final and `running` only lower bounds
/// (right-censored), with `tail` expected tokens beyond the longest sample for the mass that
/// is still running there (memoryless tail). With nothing running it is the plain mean.
pub fn censored_mean(done: &[f64], running: &[f64], tail: f64) -> f64 {
    censored_stats(done, running, tail).mean
}

/// Kaplan-Meier statistics of lengths of which `done` are final and `running` only lower
/// bounds: the mean as [`censored_mean`], and quantiles from the same survival curve (past
/// the longest sample, the memoryless tail of mean `tail`). `count` counts both.
///
/// NOTE: counting a running request as its length so far biases every quantile low; under
/// overload most running requests are still waiting (0 tokens), and the median came out 0
/// while the mean was right.
pub fn censored_stats(done: &[f64], running: &[f64], tail: f64) -> LengthStats {
    let mut samples: Vec<(f64, bool)> = done.iter().map(|&x| (x, true)).collect();
    samples.extend(running.iter().map(|&x| (x, false)));
    if samples.is_empty() {
        return LengthStats::default();
    }
    // NOTE: at equal lengths, completions come first: a request running at x may go beyond.
    samples.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    let (mut survival, mut mean, mut prev) = (1.0, 0.0, 0.0);
    let mut at_risk = samples.len() as f64;
    let mut quantiles = [None; 3];
    for &(x, finished) in &samples {
        mean += survival * (x - prev);
        prev = x;
        if finished {
            survival *= 1.0 - 1.0 / at_risk;
            for (q, p) in quantiles.iter_mut().zip([0.5, 0.9, 0.99]) {
                if q.is_none() && survival <= 1.0 - p + 1e-12 {
                    *q = Some(x);
                }
            }
        }
        at_risk -= 1.0;
    }
    let beyond = |p: f64| prev + tail * (survival / (1.0 - p)).ln().max(0.0);
    LengthStats {
        count: samples.len() as u64,
        mean: mean + survival * tail,
        p50: quantiles[0].unwrap_or_else(|| beyond(0.5)),
        p90: quantiles[1].unwrap_or_else(|| beyond(0.9)),
        p99: quantiles[2].unwrap_or_else(|| beyond(0.99)),
    }
}
