//! Deterministic draws for the lookahead's forecasts and the shadow's re-created requests: a
//! fixed-seed generator and log-normal lengths rescaled to the observed mean.

use crate::stats::LengthStats;

/// splitmix64: a tiny deterministic generator (no dependency, stable across platforms).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(super) fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Draws lengths with the observed median and p90 (log-normal) and the observed mean: the
/// draws are rescaled to the mean, which is what sets the load.
pub(super) struct Lengths {
    median: f64,
    sigma: f64,
    pub(super) mean: f64,
}

impl Lengths {
    /// Every draw `prior` (nothing observed).
    pub(super) fn prior(prior: f64) -> Self {
        Lengths {
            median: prior,
            sigma: 0.0,
            mean: prior,
        }
    }

    /// One draw, in tokens; the log-normal is scaled so that its mean is the observed one.
    pub(super) fn one(&self, rng: &mut Rng) -> u32 {
        let log_normal_mean = self.median * (self.sigma * self.sigma / 2.0).exp();
        let x = self.median * (self.sigma * rng.normal()).exp();
        tokens(x * self.mean / log_normal_mean.max(1e-9))
    }

    pub(super) fn new(s: &LengthStats, prior: f64) -> Self {
        let mean = if s.mean > 0.0 { s.mean } else { prior };
        let median = if s.p50 > 0.0 { s.p50 } else { mean };
        let sigma = if s.p90 > median {
            ((s.p90 / median).ln() / 1.2816).min(2.5)
        } else {
            0.0
        };
        Lengths {
            median,
            sigma,
            mean,
        }
    }

    pub(super) fn draw(&self, rng: &mut Rng, n: usize) -> Vec<f64> {
        let mut v: Vec<f64> = (0..n)
            .map(|_| self.median * (self.sigma * rng.normal()).exp())
            .collect();
        let m = v.iter().sum::<f64>() / n.max(1) as f64;
        if m > 0.0 {
            v.iter_mut().for_each(|x| *x *= self.mean / m);
        }
        v
    }
}

pub(super) fn tokens(x: f64) -> u32 {
    x.round().clamp(1.0, 1e6) as u32
}
