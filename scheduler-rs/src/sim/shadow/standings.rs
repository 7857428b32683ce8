//! Judging the shadows: folding settled requests into each strategy's discounted standing,
//! and the significance test that names a leader.

use crate::sim::lookahead::{LookaheadConfig, Situation};

use super::ShadowBank;

impl ShadowBank {
    /// Fold the requests that arrived at least `settle` ago into the standings.
    pub(super) fn score(&mut self, s: &Situation, cfg: &LookaheadConfig, now: f64) {
        let tau = cfg.memory_s.max(1e-3);
        let decay = (-(now - self.scored_at).max(0.0) / tau).exp();
        self.scored_at = now;
        self.total *= decay;
        self.met.iter_mut().for_each(|m| *m *= decay);
        for t in &mut self.twin_beats {
            *t = [
                t[0] * decay,
                t[1] * decay,
                t[2] * decay * decay,
                t[3] * decay,
            ];
        }
        for (row, row_sq) in self.beats.iter_mut().zip(&mut self.beats_sq) {
            row.iter_mut().for_each(|x| *x *= decay);
            row_sq.iter_mut().for_each(|x| *x *= decay * decay);
        }
        // NOTE: a request is judged once its TTFT is due (met or missed), and one still
        // decoding by whether it keeps its TPOT so far: judging by completion alone would
        // favour the strategies that finish sooner, not those that meet more SLOs.
        let longest_ttft = s
            .tiers
            .iter()
            .filter(|t| !t.background)
            .map(|t| t.ttft_ms / 1e3)
            .fold(0.0, f64::max);
        let settle = cfg.settle_s.max(1.5 * longest_ttft);
        let k = self.strategies.len();
        let mut ok = vec![false; self.runs.len()];
        while let Some(&(t, tier)) = self.fed.front() {
            if t > now - settle {
                break;
            }
            self.fed.pop_front();
            let i = self.scored;
            self.scored += 1;
            let w = if s.tiers[tier].background {
                continue;
            } else {
                s.tiers[tier].weight * (-(now - t) / tau).exp()
            };
            for (o, run) in ok.iter_mut().zip(&self.runs) {
                *o = run.on_track(i, now);
            }
            self.total += w;
            if self.twins {
                self.score_twins(&ok, w);
            }
            for a in 0..k {
                if !ok[a] {
                    continue;
                }
                self.met[a] += w;
                for b in (0..k).filter(|&b| !ok[b]) {
                    self.beats[a][b] += w;
                    self.beats_sq[a][b] += w * w;
                }
            }
        }
        let span = (now - settle - self.start).max(0.0);
        let norm = tau * (1.0 - (-span / tau).exp());
        self.rate_rps = if norm > 0.0 { self.total / norm } else { 0.0 };
    }

    /// The rival to switch to from `current` (an index), if one met significantly more:
    /// its lead over `current` exceeds `confidence` standard deviations of a sign test on
    /// the requests where the two differ, and `margin` of what `current` met.
    pub fn leader(&self, current: usize, confidence: f64, margin: f64) -> Option<usize> {
        (0..self.strategies.len())
            .filter(|&j| j != current)
            .filter(|&j| {
                let lead = self.beats[j][current] - self.beats[current][j];
                let sd = (self.beats_sq[j][current] + self.beats_sq[current][j]).sqrt();
                lead > confidence * sd && self.met[j] > self.met[current] * (1.0 + margin)
            })
            .max_by(|&a, &b| self.met[a].total_cmp(&self.met[b]).then(b.cmp(&a)))
    }
}
