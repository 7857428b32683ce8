//! Binding on against off in the shadows (issue 32): when a tier has `bind_tp`, every
//! strategy's shadow has a twin with binding off, fed the same arrivals (and the same output
//! draws). The requests one met and the other did not are a paired sample: the verdict says
//! whether binding (the cost model, as the workers run it) served the real arrivals better.
//!
//! NOTE: the verdict informs; nothing switches the workers' `--bind-policy` from the router
//! (that needs a wire message the protocol does not have yet).

use super::bind_types::BindingVerdict;
use super::shadow::ShadowBank;

impl ShadowBank {
    /// Fold one judged request of weight `w` into the twins' tallies (`ok`: per run).
    pub(super) fn score_twins(&mut self, ok: &[bool], w: f64) {
        let k = self.strategies.len();
        for (i, t) in self.twin_beats.iter_mut().enumerate() {
            let (on, off) = (ok[i], ok[k + i]);
            if off {
                t[3] += w;
            }
            if on != off {
                t[usize::from(off)] += w;
                t[2] += w * w;
            }
        }
    }

    /// Binding on vs off for strategy `current` (an index), if the bank has twins.
    pub fn binding_verdict(&self, current: usize, confidence: f64) -> Option<BindingVerdict> {
        let t = self.twin_beats.get(current)?;
        let share = |m: f64| {
            if self.total > 0.0 {
                m / self.total
            } else {
                0.0
            }
        };
        let sd = t[2].sqrt();
        let lead_sd = if sd > 0.0 { (t[0] - t[1]) / sd } else { 0.0 };
        let better = if lead_sd > confidence {
            "on"
        } else if lead_sd < -confidence {
            "off"
        } else {
            "tie"
        };
        let run = &self.runs[current];
        Some(BindingVerdict {
            strategy: self.strategies[current].name(),
            policy: run.cfg.binding,
            on_attainment: share(self.met[current]),
            off_attainment: share(t[3]),
            lead_sd,
            better: better.into(),
            decisions: run.bind_counts,
        })
    }
}

#[cfg(test)]
#[path = "shadow_binding_tests.rs"]
mod tests;
