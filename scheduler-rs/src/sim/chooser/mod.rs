//! The choice across selection rounds (issue 10): which strategy is in force and whether a
//! round keeps or switches it. Under the shadow choice (the default) a round judges the
//! shadow runs ([`super::shadow`]) and switches to one that met significantly more; under the
//! forecast choice it predicts candidates with [`super::lookahead`] and keeps each rival's
//! running advantage over the strategy in force and each strategy's measured bias
//! (delivered / predicted).

mod shadow_round;

use std::collections::{HashMap, VecDeque};

use crate::planner::strategy::Strategy;

use super::choice::{Choice, Choose, Delivered};
use super::lookahead::{predict_all, Candidate, ChoiceKind, LookaheadConfig, Situation};
use super::shadow::ShadowBank;

/// The choice across rounds.
///
/// NOTE: predictions move with each round's forecast (a burst raises every candidate), so
/// a rival is compared with the strategy in force *of the same round*: the running averages
/// are the in-force strategy's net prediction (`level`) and each rival's advantage over it
/// (`advantage`), both updated from one round's predictions. A rival predicted only every
/// few rounds (`rivals_per_round`) is then still measured against the same forecast as the
/// strategy it would replace. With every candidate predicted every round this is the same
/// as averaging each candidate's own net prediction.
#[derive(Debug)]
pub struct Chooser {
    pub cfg: LookaheadConfig,
    current: Strategy,
    /// Running average of the in-force strategy's net prediction.
    level: Option<f64>,
    /// Running average of each rival's net prediction minus the in-force one's.
    advantage: HashMap<Strategy, f64>,
    bias: HashMap<Strategy, f64>,
    /// (round time, strategy in force, its raw prediction) awaiting what was delivered.
    pending: VecDeque<(f64, Strategy, f64)>,
    /// Each strategy's latest prediction and the round it was made in.
    last: HashMap<Strategy, (u64, Candidate)>,
    rounds: u64,
    /// Shadow choice: every strategy's shadow run (made at the first round, re-made when the
    /// pool's devices or levels change).
    bank: Option<ShadowBank>,
}

impl Chooser {
    pub fn new(cfg: LookaheadConfig, initial: Strategy) -> Self {
        Chooser {
            cfg,
            current: initial,
            level: None,
            advantage: HashMap::new(),
            bias: HashMap::new(),
            pending: VecDeque::new(),
            last: HashMap::new(),
            rounds: 0,
            bank: None,
        }
    }

    /// The strategy in force.
    pub fn current(&self) -> Strategy {
        self.current
    }

    /// NOTE: the forecast (Poisson arrivals, independent log-normal lengths) misses a real
    /// trace's bursts and long-run queueing, and not by the same amount for every strategy.
    /// A round's prediction for the strategy in force is checked once the requests it covers
    /// have had time to finish (`3 × horizon_s` later, the predictor's own window); the ratio
    /// delivered / predicted corrects that strategy's later predictions.
    fn learn(&mut self, now: f64, delivered: Delivered) {
        let h = self.cfg.horizon_s;
        while let Some(&(t0, strategy, predicted)) = self.pending.front() {
            if now < t0 + 3.0 * h {
                break;
            }
            self.pending.pop_front();
            if predicted > 0.0 {
                let ratio = (delivered(t0, t0 + h) / predicted).clamp(0.2, 2.0);
                let b = self.bias.entry(strategy).or_insert(1.0);
                *b += self.cfg.bias_rate.clamp(0.0, 1.0) * (ratio - *b);
            }
        }
    }

    /// NOTE: a round's cost is its simulations, so not every candidate is predicted every
    /// round: the strategy in force always is (the one to keep or leave), and so is the
    /// best-ranked rival (the one to switch to); the other `rivals_per_round − 1` are the
    /// least recently predicted, so each is re-checked every few rounds. Only a candidate
    /// predicted this round can win it, and its average moves by `smoothing` per prediction:
    /// one prediction of a rarely checked rival does not replace its average (decaying it per
    /// round instead let single noisy predictions win: conv-sine 64 devices x160 fell from
    /// 0.90 to 0.73 of the best baseline). Every one is predicted in the first round, whenever
    /// one has no prediction yet or the strategy in force is not among them, and with
    /// `rivals_per_round` 0.
    fn wanted(&self, strategies: &[Strategy]) -> Vec<bool> {
        let n = self.cfg.rivals_per_round as usize;
        let known = |k: &Strategy| self.last.contains_key(k);
        if n == 0 || !strategies.iter().all(known) || !strategies.contains(&self.current) {
            return vec![true; strategies.len()];
        }
        let mut want: Vec<bool> = strategies.iter().map(|&k| k == self.current).collect();
        let rivals: Vec<usize> = (0..strategies.len()).filter(|&i| !want[i]).collect();
        let ahead = |i: usize| self.advantage.get(&strategies[i]).copied().unwrap_or(0.0);
        let leader = rivals
            .iter()
            .copied()
            .max_by(|&a, &b| ahead(a).total_cmp(&ahead(b)).then(b.cmp(&a)));
        if let Some(i) = leader {
            want[i] = true;
        }
        let mut stale: Vec<usize> = rivals.into_iter().filter(|&i| !want[i]).collect();
        stale.sort_by_key(|&i| (self.last[&strategies[i]].0, i));
        for i in stale.into_iter().take(n - 1) {
            want[i] = true;
        }
        want
    }

    /// One selection round: predict the strategy in force and some rivals (`wanted`), fold
    /// the predictions into the running averages, and keep or switch the strategy.
    pub fn round(&mut self, s: &Situation, now: f64, delivered: Delivered) -> Choice {
        if self.cfg.choice == ChoiceKind::Shadow {
            return self.shadow_round(s, now);
        }
        self.learn(now, delivered);
        self.rounds += 1;
        let strategies = Strategy::all(s.levels);
        // The strategy the advantages are measured against: the one in force, or (when the
        // levels changed under it) the first, with the averages started afresh.
        let anchor = match strategies.iter().position(|&x| x == self.current) {
            Some(i) => i,
            None => {
                (self.level, self.advantage) = (None, HashMap::new());
                0
            }
        };
        let wanted = self.wanted(&strategies);
        let predicted = predict_all(s, &self.cfg, Some(self.current), &wanted);
        let net = |c: &Candidate, bias: f64| {
            let both = (c.goodput_rps + c.surge_goodput_rps / self.cfg.surge.max(1.0)) / 2.0;
            bias * both - c.switch_cost_rps
        };
        let bias: Vec<f64> = strategies
            .iter()
            .map(|k| self.bias.get(k).copied().unwrap_or(1.0))
            .collect();
        let base = predicted[anchor]
            .as_ref()
            .map(|c| net(c, bias[anchor]))
            .expect("the anchor is always predicted");
        let a = self.cfg.smoothing.clamp(0.05, 1.0);
        let level = self.level.map_or(base, |l| l + a * (base - l));
        self.level = Some(level);
        let mut candidates = Vec::with_capacity(strategies.len());
        for (k, (&key, fresh)) in strategies.iter().zip(predicted).enumerate() {
            let Some(mut cand) = fresh else {
                // `wanted` predicts every strategy that has no prediction yet.
                let mut cand = self.last[&key].1.clone();
                cand.fresh = false;
                cand.smoothed_rps = level + self.advantage.get(&key).copied().unwrap_or(0.0);
                candidates.push(cand);
                continue;
            };
            cand.bias = bias[k];
            let ahead = if k == anchor {
                0.0
            } else {
                let d = net(&cand, bias[k]) - base;
                let prev = self.advantage.get(&key).copied();
                let v = prev.map_or(d, |p| p + a * (d - p));
                self.advantage.insert(key, v);
                v
            };
            cand.smoothed_rps = level + ahead;
            self.last.insert(key, (self.rounds, cand.clone()));
            candidates.push(cand);
        }
        let choice = pick(
            &strategies,
            candidates,
            Some(self.current),
            self.cfg.switch_margin,
        );
        if choice.chosen != self.current {
            // Rounds whose horizon the switch cuts measure a mix of two strategies.
            let h = self.cfg.horizon_s;
            self.pending.retain(|&(t0, _, _)| t0 + h <= now);
            // Re-base the averages on the new strategy in force (their sums are unchanged).
            let shift = self.advantage.remove(&choice.chosen).unwrap_or(0.0);
            self.level = Some(level + shift);
            for v in self.advantage.values_mut() {
                *v -= shift;
            }
            if strategies.contains(&self.current) {
                self.advantage.insert(self.current, -shift);
            }
        }
        self.current = choice.chosen;
        let raw = strategies
            .iter()
            .position(|&x| x == self.current)
            .map_or(0.0, |i| choice.candidates[i].goodput_rps);
        self.pending.push_back((now, self.current, raw));
        choice
    }
}

impl Choose for Chooser {
    fn lookback_s(&self) -> f64 {
        self.cfg.lookback_s()
    }

    fn round(&mut self, s: &Situation, now: f64, delivered: Delivered) -> Choice {
        Chooser::round(self, s, now, delivered)
    }
}

/// The winner: the best net prediction, unless the current strategy is within the margin.
fn pick(
    strategies: &[Strategy],
    candidates: Vec<Candidate>,
    current: Option<Strategy>,
    margin: f64,
) -> Choice {
    let net = |c: &Candidate| c.smoothed_rps;
    // Ties go to the earlier strategy (deterministic).
    let best = (0..candidates.len())
        .filter(|&k| candidates[k].fresh)
        .max_by(|&a, &b| {
            net(&candidates[a])
                .total_cmp(&net(&candidates[b]))
                .then(b.cmp(&a))
        })
        .expect("the strategy in force or the first round's are predicted");
    let cur = current.and_then(|c| strategies.iter().position(|&x| x == c));
    let (chosen, reason) = match cur {
        Some(k) if k == best => (k, format!("kept {}: best prediction", strategies[k].name())),
        Some(k) if net(&candidates[best]) <= net(&candidates[k]) * (1.0 + margin) => (
            k,
            format!(
                "kept {}: {:.1} req/s, within {:.0}% of {}'s {:.1}",
                strategies[k].name(),
                net(&candidates[k]),
                margin * 100.0,
                strategies[best].name(),
                net(&candidates[best]),
            ),
        ),
        Some(k) => (
            best,
            format!(
                "switched {} -> {}: {:.1} vs {:.1} req/s after a switch cost of {:.1}",
                strategies[k].name(),
                strategies[best].name(),
                net(&candidates[best]),
                net(&candidates[k]),
                candidates[best].switch_cost_rps,
            ),
        ),
        None => (
            best,
            format!(
                "chose {}: {:.1} req/s",
                strategies[best].name(),
                net(&candidates[best])
            ),
        ),
    };
    Choice {
        chosen: strategies[chosen],
        candidates,
        reason,
        binding: None,
    }
}
