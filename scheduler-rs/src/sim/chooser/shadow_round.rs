//! The shadow choice's side of the [`Chooser`]: feeding the shadow runs between rounds and
//! judging them at a round.

use crate::sim::choice::Choice;
use crate::sim::lookahead::{Candidate, Situation};
use crate::sim::shadow::ShadowBank;

use super::Chooser;

/// Requests a shadow run may hold before the bank is re-made (`Chooser::shadow_round`).
const MAX_SHADOW_REQUESTS: usize = 200_000;

impl Chooser {
    /// Between rounds: feed the shadow runs the arrivals so far and run them to `now`, so
    /// that the next round only has the last stretch left to run (the router calls this a
    /// few times a window, off the decision's path). The round's outcome does not depend on
    /// it: shadows are judged at rounds only. No-op for the forecast choice or before the
    /// first round.
    pub fn observe(&mut self, s: &Situation, now: f64) {
        if let Some(bank) = self.bank.as_mut().filter(|b| b.fits(s)) {
            bank.run_to(s, now);
        }
    }

    /// A selection round of the shadow choice: feed and run the shadows to `now`, then
    /// switch to the strategy whose shadow met significantly more requests lately, if any.
    pub(super) fn shadow_round(&mut self, s: &Situation, now: f64) -> Choice {
        self.rounds += 1;
        if !self.bank.as_ref().is_some_and(|b| b.fits(s)) {
            // NOTE: the shadows start a round before this one (the arrivals since are fed
            // now) and half a window earlier still, so that their own re-planning ticks fall
            // between rounds: on a round they cost ~3 ms of CPU at 128 devices.
            let every = f64::from(self.cfg.every_windows.max(1));
            let start = (now - s.knobs.window_s * every).max(0.0) - 0.5 * s.knobs.window_s;
            match ShadowBank::new(s, &self.cfg, start) {
                Ok(bank) => self.bank = Some(bank),
                Err(e) => {
                    return Choice {
                        chosen: self.current,
                        candidates: Vec::new(),
                        reason: format!("kept {}: no shadow runs ({e})", self.current.name()),
                        binding: None,
                    }
                }
            }
        }
        let bank = self.bank.as_mut().expect("made above");
        bank.advance(s, &self.cfg, now);
        let standing = bank.standing();
        let strategies = bank.strategies.clone();
        // The levels changed under the strategy in force: start again from the greedy.
        let current = strategies
            .iter()
            .position(|&x| x == self.current)
            .unwrap_or(0);
        let leader = bank.leader(current, self.cfg.confidence, self.cfg.shadow_margin);
        let per_pool = 1.0 / bank.scale().max(1e-9);
        let candidates: Vec<Candidate> = strategies
            .iter()
            .enumerate()
            .map(|(k, st)| {
                let attainment = if standing.total > 0.0 {
                    standing.met[k] / standing.total
                } else {
                    0.0
                };
                let goodput = attainment * standing.rate_rps * per_pool;
                Candidate {
                    strategy: st.name(),
                    goodput_rps: goodput,
                    attainment,
                    switch_cost_rps: 0.0,
                    surge_goodput_rps: 0.0,
                    smoothed_rps: goodput,
                    bias: 1.0,
                    fresh: true,
                }
            })
            .collect();
        let name = |k: usize| strategies[k].name();
        let reason = match leader {
            Some(j) => format!(
                "switched {} -> {}: its shadow met {:.0}% vs {:.0}% of the recent requests",
                name(current),
                name(j),
                candidates[j].attainment * 100.0,
                candidates[current].attainment * 100.0,
            ),
            None if standing.total <= 0.0 => {
                format!("kept {}: no request judged yet", name(current))
            }
            None => format!(
                "kept {}: no shadow met significantly more ({:.0}% of the recent requests)",
                name(current),
                candidates[current].attainment * 100.0,
            ),
        };
        self.current = strategies[leader.unwrap_or(current)];
        let binding = bank.binding_verdict(leader.unwrap_or(current), self.cfg.confidence);
        if bank.held() > MAX_SHADOW_REQUESTS {
            // NOTE: a shadow under lasting overload keeps its backlog; past the bound the
            // bank starts afresh next round (the strategy in force stays).
            self.bank = None;
        }
        Choice {
            chosen: self.current,
            candidates,
            reason,
            binding,
        }
    }
}
